//! [`DockerProvider`]: startup checks, the smoke test, orphan reconciliation, the warm pool
//! and one locked-down container per run.

use std::collections::{HashSet, VecDeque};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bollard::Docker;
use plimsoll_core::sandboxd_pb::{execute_request, execute_response, EnvVar, ExecuteRequest};
use plimsoll_core::{pb, Refusal, Tier};
use plimsoll_provider::{Answer, Facts, Provider, ProviderError, ProviderStartError, Work};
use plimsoll_runner::RunEnv;
use plimsoll_sandboxd::{CallError, SandboxdClient, Token};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::config::{DockerConfig, Limits, Runtime, Seccomp};
use crate::engine::{self, Spec, CHANNEL_DIR, LABEL_INSTANCE, SOCKET_NAME, TOKEN_NAME};
use crate::evidence;
use crate::state::{make_removable, Instance};

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

fn start_err(message: impl Into<String>) -> ProviderStartError {
    ProviderStartError::new(NAME, message)
}

/// A run's id (its label and its directory's name): 64 random bits, kept short because the
/// directory holds sandboxd's Unix socket and a socket path must fit in `sun_path`.
fn random_hex() -> String {
    hex::encode(rand::random::<[u8; 8]>())
}

/// The longest Unix socket path Linux accepts (`sun_path` is 108 bytes with its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// A granted run's relay socket, beside sandboxd's in the run directory (so inside the
/// container at [`CHANNEL_DIR`]). No longer than [`SOCKET_NAME`], so the `sun_path` check
/// in [`DockerProvider::new`] covers it too.
pub const GRANT_SOCKET_NAME: &str = "g.sock";
const _: () = assert!(GRANT_SOCKET_NAME.len() <= SOCKET_NAME.len());

/// Opens a granted run's relay on a Unix socket in the run's host directory `dir` (mounted
/// at [`CHANNEL_DIR`]) and writes the clients beside it. Returns the relay and the run's
/// variables, with container paths. Nothing has run when this fails.
async fn open_grant(
    dir: &Path,
    grant: &plimsoll_grants::RunGrant,
) -> Result<(plimsoll_grants::Relay, Vec<(String, String)>), String> {
    use plimsoll_grants::{client, env_names};
    client::write(dir)
        .map_err(|e| format!("cannot write the grant clients in {}: {e}", dir.display()))?;
    let sock = dir.join(GRANT_SOCKET_NAME);
    let relay = grant
        .open_unix(&sock)
        .await
        .map_err(|e| format!("cannot open the grant relay at {}: {e}", sock.display()))?;
    // The container's user is not the daemon's: it needs write permission to connect. The
    // directory itself stays locked (0755), so it can create nothing there.
    if let Err(e) = std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)) {
        relay.close().await;
        return Err(format!(
            "cannot open {} to the container's user: {e}",
            sock.display()
        ));
    }
    let inside = format!("{CHANNEL_DIR}/{GRANT_SOCKET_NAME}");
    let mut vars: Vec<(String, String)> = relay
        .env()
        .into_iter()
        .map(|(k, v)| {
            if k == env_names::SOCKET {
                (k, inside.clone())
            } else {
                (k, v)
            }
        })
        .collect();
    vars.push((
        env_names::JS.into(),
        format!("{CHANNEL_DIR}/{}", client::JS_NAME),
    ));
    vars.push((
        env_names::PY.into(),
        format!("{CHANNEL_DIR}/{}", client::PY_NAME),
    ));
    Ok((relay, vars))
}

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

/// Connects to the engine's Unix socket (not yet contacted).
pub fn connect(socket: &Path) -> Result<Docker, String> {
    Docker::connect_with_unix(
        &format!("unix://{}", socket.display()),
        engine::API_TIMEOUT_S,
        bollard::API_DEFAULT_VERSION,
    )
    .map_err(|e| {
        format!(
            "DOCKER_HOST: cannot reach the Docker engine at unix://{}: {e}; start dockerd or point DOCKER_HOST at its socket",
            socket.display()
        )
    })
}

impl DockerProvider {
    /// Checks the configuration, reads the seccomp profile, claims this start's instance in
    /// the state directory. Nothing is asked of the engine until [`Provider::start`].
    pub fn new(cfg: DockerConfig) -> Result<DockerProvider, ProviderStartError> {
        if cfg.image.trim().is_empty() {
            return Err(start_err(
                "SANDBOX_DOCKER_IMAGE is not set; build the sandbox image with `cargo xtask images` and set it to the printed image ID",
            ));
        }
        if cfg.pool > crate::config::MAX_POOL {
            return Err(start_err(format!(
                "SANDBOX_DOCKER_POOL: {} is more than {}",
                cfg.pool,
                crate::config::MAX_POOL
            )));
        }
        let limits = cfg
            .limits()
            .map_err(|(var, m)| start_err(format!("{var}: {m}")))?;
        let socket = cfg.socket_path().map_err(start_err)?;
        let seccomp_json = match &cfg.seccomp {
            Seccomp::EngineDefault => None,
            Seccomp::File(p) => {
                let text = std::fs::read_to_string(p).map_err(|e| {
                    start_err(format!("SANDBOX_DOCKER_SECCOMP: {}: {e}", p.display()))
                })?;
                serde_json::from_str::<serde_json::Value>(&text).map_err(|e| {
                    start_err(format!(
                        "SANDBOX_DOCKER_SECCOMP: {} is not a JSON seccomp profile: {e}",
                        p.display()
                    ))
                })?;
                Some(text)
            }
        };
        let docker = connect(&socket).map_err(start_err)?;
        let instance = Instance::claim(&cfg.state_dir).map_err(|e| {
            start_err(format!(
                "PLIMSOLL_STATE_DIR: cannot keep the docker provider's state under {}: {e}",
                cfg.state_dir.display()
            ))
        })?;
        let longest = instance
            .dir()
            .join(random_hex())
            .join(SOCKET_NAME)
            .as_os_str()
            .len();
        if longest > MAX_SOCKET_PATH {
            return Err(start_err(format!(
                "PLIMSOLL_STATE_DIR: {} is too long: each run's sandboxd socket would need a {longest}-byte path, and Linux allows {MAX_SOCKET_PATH}; choose a shorter directory",
                cfg.state_dir.display()
            )));
        }
        Ok(DockerProvider {
            inner: Arc::new(Inner {
                cfg,
                limits,
                seccomp_json,
                docker,
                socket,
                instance,
                proven: OnceLock::new(),
                pool: Mutex::new(VecDeque::new()),
                refill: Arc::new(Notify::new()),
                live: Mutex::new(HashSet::new()),
                removing: AtomicUsize::new(0),
                removed: Notify::new(),
                launching: AtomicUsize::new(0),
                launched: Notify::new(),
                closed: AtomicBool::new(false),
            }),
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
        loop {
            let wait = self.inner.removed.notified();
            if self.inner.removing.load(Ordering::SeqCst) == 0 {
                return;
            }
            wait.await;
        }
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
        let inner = &self.inner;
        inner.closed.store(true, Ordering::SeqCst);
        inner.refill.notify_one();
        let warm: Vec<Warm> = inner.lock_pool().drain(..).collect();
        for w in warm {
            inner.discard(w).await;
        }
        let in_flight = async {
            inner.launches_done().await;
            self.settle().await;
        };
        if tokio::time::timeout(SHUTDOWN_WAIT, in_flight)
            .await
            .is_err()
        {
            tracing::warn!(
                launching = inner.launching.load(Ordering::SeqCst),
                removing = inner.removing.load(Ordering::SeqCst),
                wait_s = SHUTDOWN_WAIT.as_secs(),
                "container launches or removals still in flight at shutdown; removing this instance's containers by label"
            );
        }
        match tokio::time::timeout(SHUTDOWN_WAIT, inner.remove_instance()).await {
            Ok(Ok(0)) => {
                tracing::info!(instance = %inner.instance.id(), "docker provider stopped; no container of this instance is left")
            }
            Ok(Ok(n)) => tracing::error!(instance = %inner.instance.id(), left = n,
                "containers of this instance could not be removed at shutdown; the next start with this state directory removes them"),
            Ok(Err(e)) => tracing::error!(instance = %inner.instance.id(), error = %e,
                "cannot list this instance's containers at shutdown; the next start with this state directory removes them"),
            Err(_) => {
                tracing::error!(instance = %inner.instance.id(), wait_s = SHUTDOWN_WAIT.as_secs(),
                "the engine did not finish removing this instance's containers at shutdown; the next start with this state directory removes them")
            }
        }
    }
}

/// Counts one launch in flight until dropped (also when the launch's future is dropped).
struct Launching<'a>(&'a Inner);

impl Drop for Launching<'_> {
    fn drop(&mut self) {
        self.0.launching.fetch_sub(1, Ordering::SeqCst);
        self.0.launched.notify_waiters();
    }
}

impl Inner {
    fn lock_pool(&self) -> std::sync::MutexGuard<'_, VecDeque<Warm>> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_live(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until no launch is in flight.
    async fn launches_done(&self) {
        loop {
            let wait = self.launched.notified();
            if self.launching.load(Ordering::SeqCst) == 0 {
                return;
            }
            wait.await;
        }
    }

    /// Removes every container labelled with this instance, with its run directory;
    /// returns how many are still listed afterwards.
    async fn remove_instance(&self) -> Result<usize, bollard::errors::Error> {
        let ids =
            engine::containers_labelled(&self.docker, LABEL_INSTANCE, self.instance.id()).await?;
        for id in &ids {
            tracing::debug!(container = %engine::short(id), "removing a container of this instance at shutdown");
            engine::remove(&self.docker, id).await;
            self.lock_live().remove(id);
        }
        if !ids.is_empty() {
            tracing::info!(
                containers = ids.len(),
                "removed containers still labelled with this instance at shutdown"
            );
        }
        let left =
            engine::containers_labelled(&self.docker, LABEL_INSTANCE, self.instance.id()).await?;
        if left.is_empty() {
            make_removable(self.instance.dir());
            if let Ok(rd) = std::fs::read_dir(self.instance.dir()) {
                for e in rd.flatten() {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        Ok(left.len())
    }

    fn spec<'a>(&'a self, image_id: &'a str, run_id: &'a str, dir: &'a Path) -> Spec<'a> {
        Spec {
            image_id,
            runtime: self.cfg.engine_runtime(),
            limits: self.limits,
            seccomp_json: self.seccomp_json.as_deref(),
            instance: self.instance.id(),
            run_id,
            host_dir: dir,
            default_timeout_ms: self.cfg.default_timeout.as_millis() as u64,
            output_bytes: self.cfg.output_bytes,
            languages: self.proven.get().map(|p| p.languages.as_slice()),
        }
    }

    /// Creates, starts and waits for one container of `image_id`. Refused once the provider
    /// is closed; a launch that began before sees it at its next step and removes its
    /// container.
    async fn launch(&self, image_id: &str) -> Result<Warm, String> {
        // Counted before `closed` is read: shutdown sets `closed` before it reads the count,
        // so either this launch sees it closed or shutdown waits for this launch.
        self.launching.fetch_add(1, Ordering::SeqCst);
        let _counted = Launching(self);
        if self.closed.load(Ordering::SeqCst) {
            return Err("the provider is shutting down".into());
        }
        let run_id = random_hex();
        let dir = self.instance.dir().join(&run_id);
        let token = Token::new(random_hex()).map_err(|e| e.to_string())?;
        let prepare = || -> std::io::Result<()> {
            std::fs::create_dir(&dir)?;
            // The guest user must create its socket here; locked again once it has.
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))?;
            let tf = dir.join(TOKEN_NAME);
            std::fs::write(&tf, format!("{}\n", token.expose()))?;
            std::fs::set_permissions(&tf, std::fs::Permissions::from_mode(0o644))
        };
        if let Err(e) = prepare() {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(format!(
                "cannot prepare the run directory {}: {e}",
                dir.display()
            ));
        }
        let spec = self.spec(image_id, &run_id, &dir);
        let id = match engine::create_and_start(&self.docker, &spec).await {
            Ok(id) => id,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        self.lock_live().insert(id.clone());
        let warm = Warm {
            id,
            run_id,
            dir,
            token,
        };
        if self.closed.load(Ordering::SeqCst) {
            self.discard(warm).await;
            return Err("the provider is shutting down".into());
        }
        match self.wait_ready(&warm).await {
            Ok(()) => Ok(warm),
            Err(e) if self.closed.load(Ordering::SeqCst) => {
                self.discard(warm).await;
                Err(e)
            }
            Err(e) => {
                let logs = engine::log_tail(&self.docker, &warm.id).await;
                self.discard(warm).await;
                Err(if logs.is_empty() {
                    e
                } else {
                    format!("{e}; the container's log ends with: {logs}")
                })
            }
        }
    }

    /// Waits for sandboxd's socket, then deletes the token file and locks the directory so
    /// nothing in the container can write to the host again.
    async fn wait_ready(&self, w: &Warm) -> Result<(), String> {
        let sock = w.dir.join(SOCKET_NAME);
        let start = Instant::now();
        let mut next_check = start + Duration::from_millis(250);
        loop {
            if std::fs::symlink_metadata(&sock).is_ok() {
                break;
            }
            if self.closed.load(Ordering::SeqCst) {
                return Err("the provider is shutting down".into());
            }
            let now = Instant::now();
            if now - start > READY_TIMEOUT {
                return Err(format!(
                    "sandboxd did not open its socket within {READY_TIMEOUT:?}"
                ));
            }
            if now >= next_check {
                next_check = now + Duration::from_millis(250);
                let state = self
                    .docker
                    .inspect_container(&w.id, None)
                    .await
                    .map_err(|e| format!("the engine lost the container: {e}"))?
                    .state;
                let running = state.as_ref().and_then(|s| s.running).unwrap_or(false);
                if !running {
                    return Err(format!(
                        "the container stopped before sandboxd was ready (exit code {})",
                        state.and_then(|s| s.exit_code).unwrap_or(-1)
                    ));
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        // sandboxd read the token before it bound the socket.
        let _ = std::fs::remove_file(w.dir.join(TOKEN_NAME));
        std::fs::set_permissions(&w.dir, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("cannot lock {}: {e}", w.dir.display()))?;
        Ok(())
    }

    /// Connects to a ready container's sandboxd. A failure sent nothing.
    async fn connect(&self, w: &Warm) -> Result<SandboxdClient, CallError> {
        let sock = w.dir.join(SOCKET_NAME);
        let mut tries = 0;
        loop {
            match SandboxdClient::connect_unix(&sock, &w.token).await {
                Ok(c) => return Ok(c),
                // The socket exists a moment before it accepts.
                Err(e) if tries < 50 => {
                    tries += 1;
                    tracing::debug!(error = %e, "sandboxd socket not accepting yet");
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Removes a container and its run directory, now.
    async fn discard(&self, w: Warm) {
        tracing::debug!(run = %w.run_id, container = %engine::short(&w.id), "removing a used sandbox container");
        engine::remove(&self.docker, &w.id).await;
        self.lock_live().remove(&w.id);
        make_removable(&w.dir);
        let _ = std::fs::remove_dir_all(&w.dir);
    }

    /// Removes a container in the background (the answer does not wait for it).
    fn discard_later(self: &Arc<Self>, w: Warm) {
        self.removing.fetch_add(1, Ordering::SeqCst);
        let me = self.clone();
        tokio::spawn(async move {
            me.discard(w).await;
            me.removing.fetch_sub(1, Ordering::SeqCst);
            me.removed.notify_waiters();
        });
    }

    /// A ready container: from the warm pool, else a fresh one.
    async fn take(&self, image_id: &str) -> Result<(Warm, bool), String> {
        let pooled = self.lock_pool().pop_front();
        if let Some(w) = pooled {
            self.refill.notify_one();
            return Ok((w, true));
        }
        self.launch(image_id).await.map(|w| (w, false))
    }

    async fn run(
        self: &Arc<Self>,
        work: Work,
        timeout: Duration,
        env: Vec<(String, String)>,
        grant: Option<plimsoll_grants::RunGrant>,
    ) -> Result<Answer, ProviderError> {
        let Some(proven) = self.proven.get().cloned() else {
            return Err(Refusal::environment(
                "the docker provider has not passed its startup checks",
            )
            .into());
        };
        if self.closed.load(Ordering::SeqCst) {
            return Err(Refusal::capacity("the docker provider is shutting down").into());
        }
        RunEnv::new(env.clone()).map_err(|e| Refusal::request(format!("{e}; nothing ran")))?;
        let payload = match work {
            Work::Javascript(js) => {
                if !proven.languages.iter().any(|l| l == "javascript") {
                    return Err(Refusal::unsupported(
                        "node did not pass the startup check in the sandbox image; javascript is unavailable",
                    )
                    .into());
                }
                execute_request::Payload::Javascript(js)
            }
            Work::Project(p) => execute_request::Payload::Project(p),
        };
        let mut req = ExecuteRequest {
            timeout_ms: timeout.as_millis().min(u128::from(u32::MAX)) as u32,
            env: env
                .into_iter()
                .map(|(name, value)| EnvVar { name, value })
                .collect(),
            trace_id: String::new(),
            payload: Some(payload),
        };
        // A pool member that died while it waited sent nothing: one fresh container is tried.
        let (warm, client) = {
            let (w, pooled) = self.take(&proven.image_id).await.map_err(|e| {
                Refusal::environment(format!(
                    "no sandbox container could be started: {e}; nothing ran"
                ))
            })?;
            match self.connect(&w).await {
                Ok(c) => (w, c),
                Err(e) if pooled => {
                    tracing::warn!(error = %e, "a warm container was unusable; starting a fresh one");
                    self.discard_later(w);
                    let w = self.launch(&proven.image_id).await.map_err(|e| {
                        Refusal::environment(format!(
                            "no sandbox container could be started: {e}; nothing ran"
                        ))
                    })?;
                    match self.connect(&w).await {
                        Ok(c) => (w, c),
                        Err(e) => {
                            self.discard_later(w);
                            return Err(e
                                .refusal()
                                .unwrap_or_else(|| Refusal::environment(e.to_string()))
                                .into());
                        }
                    }
                }
                Err(e) => {
                    self.discard_later(w);
                    return Err(e
                        .refusal()
                        .unwrap_or_else(|| Refusal::environment(e.to_string()))
                        .into());
                }
            }
        };
        // The run's relay opens in its own directory, once the container is chosen.
        let relay = match &grant {
            None => None,
            Some(g) => match open_grant(&warm.dir, g).await {
                Ok((relay, vars)) => {
                    req.env
                        .extend(vars.into_iter().map(|(name, value)| EnvVar { name, value }));
                    Some(relay)
                }
                Err(e) => {
                    self.discard_later(warm);
                    return Err(Refusal::environment(format!(
                        "the docker provider could not prepare the run's grant: {e}; nothing ran"
                    ))
                    .into());
                }
            },
        };
        let outcome = tokio::time::timeout(timeout + DEADLINE_GRACE, client.execute(req)).await;
        drop(client);
        // The grant ends with the run.
        if let Some(relay) = relay {
            relay.close().await;
        }
        match outcome {
            Err(_) => {
                // sandboxd did not answer: the container is killed before the run is answered.
                engine::kill(&self.docker, &warm.id).await;
                let id = engine::short(&warm.id).to_owned();
                self.discard_later(warm);
                Err(ProviderError::Failed(format!(
                    "the sandbox did not answer within the deadline ({timeout:?}) plus {DEADLINE_GRACE:?}; container {id} was killed"
                )))
            }
            Ok(Err(e)) => {
                engine::kill(&self.docker, &warm.id).await;
                self.discard_later(warm);
                match e.refusal() {
                    Some(r) => Err(r.into()),
                    None => Err(ProviderError::Failed(e.to_string())),
                }
            }
            Ok(Ok(resp)) => {
                let answer = match resp.result {
                    Some(execute_response::Result::Javascript(j)) => Answer::Javascript(j),
                    Some(execute_response::Result::Project(p)) => Answer::Project(p),
                    None => {
                        self.discard_later(warm);
                        return Err(ProviderError::Failed(
                            "sandboxd answered without a result".into(),
                        ));
                    }
                };
                let timed_out = match &answer {
                    Answer::Javascript(j) => j.timed_out,
                    Answer::Project(p) => p.outcome == pb::ProjectOutcome::TimedOut as i32,
                };
                if timed_out {
                    // Whatever the runner's sweep missed dies with the container, before
                    // the caller hears the deadline passed.
                    engine::kill(&self.docker, &warm.id).await;
                }
                self.discard_later(warm);
                Ok(answer)
            }
        }
    }

    /// Removes every container of ended daemon starts recorded in this state directory.
    async fn reconcile(&self) -> Result<usize, String> {
        let ended = self
            .instance
            .ended(&self.cfg.state_dir)
            .map_err(|e| format!("cannot read {}: {e}", self.cfg.state_dir.display()))?;
        let mut removed = 0;
        for e in ended {
            let ids = engine::containers_labelled(&self.docker, LABEL_INSTANCE, &e.id)
                .await
                .map_err(|err| format!("cannot list containers: {err}"))?;
            for id in &ids {
                engine::remove(&self.docker, id).await;
            }
            let left = engine::containers_labelled(&self.docker, LABEL_INSTANCE, &e.id)
                .await
                .map_err(|err| format!("cannot list containers: {err}"))?;
            if !left.is_empty() {
                return Err(format!(
                    "{} container(s) of ended instance {} could not be removed",
                    left.len(),
                    e.id
                ));
            }
            removed += ids.len();
            if !ids.is_empty() {
                tracing::info!(instance = %e.id, containers = ids.len(), "removed containers a previous daemon start left behind");
            }
            let id = e.id.clone();
            if let Err(err) = e.forget() {
                tracing::warn!(instance = %id, error = %err, "could not remove an ended instance's state");
            }
        }
        Ok(removed)
    }

    /// Resolves the image to its content ID and checks its configuration.
    async fn verify_image(&self) -> Result<String, String> {
        let img = self.docker.inspect_image(&self.cfg.image).await.map_err(|e| {
            if engine::is_not_found(&e) {
                format!(
                    "SANDBOX_DOCKER_IMAGE: image {:?} is not on the engine; build it with `cargo xtask images` (no registry is consulted)",
                    self.cfg.image
                )
            } else {
                format!("SANDBOX_DOCKER_IMAGE: cannot inspect {:?}: {e}", self.cfg.image)
            }
        })?;
        let id = img.id.filter(|i| i.starts_with("sha256:")).ok_or_else(|| {
            format!(
                "SANDBOX_DOCKER_IMAGE: the engine gave {:?} no content ID",
                self.cfg.image
            )
        })?;
        let config = img.config.unwrap_or_default();
        let refused = evidence::refused_image_env(config.env.as_deref().unwrap_or_default());
        if !refused.is_empty() {
            return Err(format!(
                "SANDBOX_DOCKER_IMAGE: image {} sets {} in its ENV, which would choose what a program loads or runs; remove it from the image",
                engine::short(&id),
                refused.join(", ")
            ));
        }
        if let Some(v) = config.volumes.filter(|v| !v.is_empty()) {
            return Err(format!(
                "SANDBOX_DOCKER_IMAGE: image {} declares VOLUME {v:?}; a volume is writable host disk outside the limits, remove it",
                engine::short(&id)
            ));
        }
        Ok(id)
    }

    /// The runtime the configuration names must be listed by the engine; a runsc runtime
    /// must be runsc and be registered with the arguments the provider needs
    /// ([`evidence::check_runsc_args`]). Returns whether runs can reach a grant relay.
    async fn verify_runtime(&self) -> Result<bool, String> {
        let info = self
            .docker
            .info()
            .await
            .map_err(|e| format!("cannot read the engine's info: {e}"))?;
        let runtimes = info.runtimes.unwrap_or_default();
        let want = self.cfg.engine_runtime();
        let var = format!("SANDBOX_DOCKER_RUNTIME={}", self.cfg.runtime.as_str());
        let Some(rt) = runtimes.get(want) else {
            let mut listed: Vec<&String> = runtimes.keys().collect();
            listed.sort();
            return Err(format!(
                "{var}: the engine does not list runtime {want:?} (it lists {listed:?}){}",
                if self.cfg.runtime == Runtime::Runsc {
                    format!("; install gVisor's runsc (apt-get install runsc) and add \"runtimes\": {{\"{want}\": {{\"path\": \"/usr/bin/runsc\", \"runtimeArgs\": [\"--network=none\", \"--host-uds=all\"]}}}} to /etc/docker/daemon.json, then send SIGHUP to dockerd (.ci/register-runsc does both)")
                } else {
                    String::new()
                }
            ));
        };
        if self.cfg.runtime == Runtime::Runc {
            return Ok(true);
        }
        let path = rt.path.clone().unwrap_or_default();
        let base = Path::new(&path)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if base != "runsc" {
            return Err(format!(
                "{var}: the engine's runtime {want:?} runs {path:?}, not an executable named runsc"
            ));
        }
        let args = rt.runtime_args.clone().unwrap_or_default();
        let channel =
            evidence::check_runsc_args(want, &path, &args).map_err(|e| format!("{var}: {e}"))?;
        if !channel.grants {
            tracing::warn!(runtime = want, args = ?args, "runsc runs with --host-uds=create: code cannot reach a grant relay's socket, so this provider offers no grants (use --host-uds=all to offer them)");
        }
        Ok(channel.grants)
    }

    fn lockdown_digest(&self, image_id: &str) -> String {
        let dir = Path::new("/run-dir");
        let s = self.spec(image_id, "run", dir);
        let b = engine::container_body(&s);
        let h = b.host_config.unwrap_or_default();
        let mut tmpfs: Vec<String> = h
            .tmpfs
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect();
        tmpfs.sort();
        let text = format!(
            "image={image_id}\nuser={:?}\nruntime={:?}\nnetwork={:?}\nreadonly_rootfs={:?}\ncap_drop={:?}\nsecurity_opt={:?}\nmemory={:?}\nmemory_swap={:?}\nnano_cpus={:?}\npids={:?}\ntmpfs={tmpfs:?}\nmounts=1 bind {}\n",
            b.user,
            h.runtime,
            h.network_mode,
            h.readonly_rootfs,
            h.cap_drop,
            h.security_opt,
            h.memory,
            h.memory_swap,
            h.nano_cpus,
            h.pids_limit,
            engine::CHANNEL_DIR,
        );
        format!(
            "docker-lockdown:sha256:{}",
            plimsoll_core::digest::sha256_hex(text.as_bytes())
        )
    }

    /// The smoke test: one real container of the image, exactly as runs get it.
    async fn smoke(&self, image_id: &str) -> Result<(Vec<String>, Tier), String> {
        let w = self.launch(image_id).await.map_err(|e| {
            format!(
                "the smoke test could not start a container of {}: {e}",
                engine::short(image_id)
            )
        })?;
        let result = async {
            let client = self.connect(&w).await.map_err(|e| e.to_string())?;
            let health = client.health().await.map_err(|e| e.to_string())?;
            let resp = client
                .execute(ExecuteRequest {
                    timeout_ms: 60_000,
                    env: vec![],
                    trace_id: "plimsoll-docker-smoke".into(),
                    payload: Some(execute_request::Payload::Project(evidence::smoke_project())),
                })
                .await
                .map_err(|e| e.to_string())?;
            let Some(execute_response::Result::Project(p)) = resp.result else {
                return Err("sandboxd answered the smoke run without a project result".to_owned());
            };
            let facts = evidence::check_smoke(&p)?;
            let tier = match self.cfg.runtime {
                Runtime::Runc => Tier::Container,
                Runtime::Runsc => {
                    let host = std::fs::read_to_string("/proc/version").unwrap_or_default();
                    let why = evidence::gvisor_evidence(&facts.proc_version, &facts.dmesg, &host)
                        .map_err(|e| format!("SANDBOX_DOCKER_RUNTIME=runsc: {e}"))?;
                    tracing::info!(evidence = %why, "gVisor proven");
                    Tier::Kernel
                }
            };
            let languages: Vec<String> = facts
                .languages
                .into_iter()
                .filter(|l| health.languages.contains(l))
                .collect();
            Ok((languages, tier))
        }
        .await;
        self.discard(w).await;
        result
    }

    fn spawn_refill(self: &Arc<Self>, image_id: String) {
        if self.cfg.pool == 0 {
            return;
        }
        let weak = Arc::downgrade(self);
        let refill = self.refill.clone();
        let want = self.cfg.pool;
        tokio::spawn(async move {
            let mut failures = 0u32;
            loop {
                let Some(me) = weak.upgrade() else { return };
                if me.closed.load(Ordering::SeqCst) {
                    return;
                }
                if me.lock_pool().len() >= want {
                    drop(me);
                    refill.notified().await;
                    continue;
                }
                match me.launch(&image_id).await {
                    Ok(w) => {
                        failures = 0;
                        if me.closed.load(Ordering::SeqCst) {
                            me.discard(w).await;
                            return;
                        }
                        me.lock_pool().push_back(w);
                    }
                    Err(_) if me.closed.load(Ordering::SeqCst) => return,
                    Err(e) => {
                        failures += 1;
                        tracing::warn!(error = %e, "could not start a warm container");
                        drop(me);
                        tokio::time::sleep(Duration::from_millis(250) * failures.min(20)).await;
                    }
                }
            }
        });
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
        let inner = &self.inner;
        let socket = inner.socket.display().to_string();
        inner.docker.ping().await.map_err(|e| {
            start_err(format!(
                "cannot reach the Docker engine at unix://{socket}: {e}; start dockerd or point DOCKER_HOST at its socket"
            ))
        })?;
        let docker = inner
            .docker
            .clone()
            .negotiate_version()
            .await
            .map_err(|e| {
                start_err(format!(
                    "the Docker engine at unix://{socket} did not state its API version: {e}"
                ))
            })?;
        // The negotiated client shares the connection pool; later calls use that version.
        drop(docker);
        let grants = inner.verify_runtime().await.map_err(start_err)?;
        let image_id = inner.verify_image().await.map_err(start_err)?;
        let removed = inner.reconcile().await.map_err(start_err)?;
        // The image is scanned before any container of it starts, the smoke test's included.
        if let Some(w) = &inner.cfg.withheld {
            crate::scan::run(&inner.docker, &image_id, w)
                .await
                .map_err(|m| ProviderStartError::ship_scan(NAME, m))?;
        }
        let (languages, tier) = inner.smoke(&image_id).await.map_err(start_err)?;
        let policy = inner.lockdown_digest(&image_id);
        tracing::info!(image = %image_id, isolation = %tier, languages = ?languages, instance = %inner.instance.id(),
            orphans_removed = removed, pool = inner.cfg.pool, "docker provider smoke test passed");
        let _ = inner.proven.set(Proven {
            environment: environment(&image_id, inner.cfg.runtime),
            image_id: image_id.clone(),
            tier,
            grants,
            languages,
            policy,
        });
        inner.spawn_refill(image_id);
        Ok(())
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
        use plimsoll_grants::client;
        let work = match work {
            Work::Project(mut p) => {
                for (name, text) in [(client::JS_NAME, client::JS), (client::PY_NAME, client::PY)] {
                    if !p.files.iter().any(|f| f.path == name) {
                        p.files.push(pb::ProjectFile {
                            path: name.into(),
                            content: text.into(),
                        });
                    }
                }
                Work::Project(p)
            }
            other => other,
        };
        self.inner.run(work, timeout, Vec::new(), Some(grant)).await
    }
}

impl Drop for DockerProvider {
    fn drop(&mut self) {
        let inner = &self.inner;
        inner.closed.store(true, Ordering::SeqCst);
        inner.refill.notify_one();
        let mut ids: Vec<String> = inner.lock_live().drain().collect();
        ids.extend(inner.lock_pool().drain(..).map(|w| w.id));
        ids.sort();
        ids.dedup();
        if ids.is_empty() {
            return;
        }
        // Drop cannot await: a short-lived thread with its own runtime removes what is left.
        // Whatever it misses, the next start with this state directory removes.
        let socket = inner.socket.clone();
        let handle = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                let Ok(docker) = connect(&socket) else { return };
                for id in ids {
                    let _ =
                        tokio::time::timeout(Duration::from_secs(10), engine::remove(&docker, &id))
                            .await;
                }
            });
        });
        let _ = handle.join();
    }
}
