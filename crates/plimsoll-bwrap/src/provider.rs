//! [`BwrapProvider`]: startup (host checks, the smoke test from inside a real sandbox),
//! runs (a sandbox from the warm pool or a fresh one, used once, killed before the answer),
//! the warm pool, and stopping.
//!
//! Files: `<state>/bwrap/<instance>/` holds this start's seccomp filter and one directory
//! per live sandbox; `<state>/bwrap/<instance>.lock` is held (flock) while plimsolld runs,
//! so the next start removes only what a dead start left (its sandboxes died with it:
//! `--die-with-parent`).

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};
use plimsoll_core::{Refusal, Tier};
use plimsoll_provider::{
    Answer, Facts, Provider, ProviderError, ProviderStartError, SessionProvider, Work,
};
use plimsoll_runner::RunEnv;
use plimsoll_sandboxd::CallError;
use tokio::sync::Notify;

use crate::command::{Spec, CHANNEL_DIR, GRANT_SOCKET_NAME};
use crate::config::{BwrapConfig, NAME, TMP_MB};
use crate::sandbox::{Launch, LaunchError, Sandbox};
use crate::{evidence, host};
use plimsoll_provider::seccomp;

/// The longest Unix socket path Linux accepts (`sun_path` is 108 bytes with its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// Time a run is given beyond its own deadline for sandboxd to answer; past it the sandbox
/// is killed and the run fails (the code may have run).
pub const DEADLINE_GRACE: Duration = Duration::from_secs(5);

/// What `start` proved.
#[derive(Debug, Clone)]
pub(crate) struct Proven {
    pub(crate) launch: Launch,
    pub(crate) sandboxd: PathBuf,
    pub(crate) languages: Vec<String>,
    pub(crate) environment: String,
}

pub(crate) struct Inner {
    pub(crate) cfg: BwrapConfig,
    dir: PathBuf,
    _lock: Flock<File>,
    pub(crate) proven: OnceLock<Proven>,
    pool: Mutex<VecDeque<Sandbox>>,
    launching: AtomicUsize,
    refill: Notify,
    pub(crate) closed: AtomicBool,
}

/// The bwrap provider. See the crate documentation.
pub struct BwrapProvider {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for BwrapProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BwrapProvider")
            .field("dir", &self.inner.dir)
            .finish()
    }
}

fn start_error(m: impl Into<String>) -> ProviderStartError {
    ProviderStartError::new(NAME, m)
}

/// Takes this start's instance below `<state>/bwrap`, after removing what dead starts left.
fn claim_instance(state_dir: &Path) -> std::io::Result<(PathBuf, Flock<File>)> {
    let base = state_dir.join("bwrap");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(&base)?;
    for e in std::fs::read_dir(&base)?.flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "lock") {
            let Ok(f) = OpenOptions::new().read(true).write(true).open(&p) else {
                continue;
            };
            if let Ok(_held) = Flock::lock(f, FlockArg::LockExclusiveNonblock) {
                tracing::info!(dir = %p.with_extension("").display(), "removing what an ended plimsolld start left");
                let _ = std::fs::remove_dir_all(p.with_extension(""));
                let _ = std::fs::remove_file(&p);
            }
        }
    }
    let id = hex::encode(rand::random::<[u8; 6]>());
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(base.join(format!("{id}.lock")))?;
    let lock = Flock::lock(f, FlockArg::LockExclusiveNonblock)
        .map_err(|(_, e)| std::io::Error::from(e))?;
    let dir = base.join(id);
    std::fs::DirBuilder::new().mode(0o711).create(&dir)?;
    Ok((dir, lock))
}

impl BwrapProvider {
    /// Claims this start's directory below the state directory. Nothing runs until
    /// [`Provider::start`].
    pub fn new(cfg: BwrapConfig) -> Result<BwrapProvider, ProviderStartError> {
        let (dir, lock) = claim_instance(&cfg.state_dir).map_err(|e| {
            start_error(format!(
                "cannot prepare {}: {e}",
                cfg.state_dir.join("bwrap").display()
            ))
        })?;
        Ok(BwrapProvider {
            inner: Arc::new(Inner {
                cfg,
                dir,
                _lock: lock,
                proven: OnceLock::new(),
                pool: Mutex::new(VecDeque::new()),
                launching: AtomicUsize::new(0),
                refill: Notify::new(),
                closed: AtomicBool::new(false),
            }),
        })
    }

    /// Runs `work` with extra environment variables for its programs (refused, marked
    /// `request`, when a name would choose what a program loads or runs).
    pub async fn run_with_env(
        &self,
        work: Work,
        timeout: Duration,
        env: Vec<(String, String)>,
    ) -> Result<Answer, ProviderError> {
        self.inner.run(work, timeout, env, None).await
    }

    /// Stops the provider: refuses runs afterwards and kills the warm pool.
    pub async fn shutdown(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.inner.refill.notify_waiters();
        let drained: Vec<Sandbox> = self.inner.lock_pool().drain(..).collect();
        for s in drained {
            s.end().await;
        }
    }
}

/// The environment identity: bubblewrap's version and the seccomp filter's digest (the
/// provider adds `;landlock` when the smoke test proved that layer).
pub fn environment(version: &str) -> String {
    format!("bwrap:{version};seccomp={}", seccomp::digest())
}

impl Inner {
    pub(crate) fn lock_pool(&self) -> std::sync::MutexGuard<'_, VecDeque<Sandbox>> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The command line's settings for a sandbox.
    pub(crate) fn spec(&self, p: &Proven, session: bool) -> Spec {
        Spec {
            run_dir: PathBuf::new(),
            sandboxd: p.sandboxd.clone(),
            work_bytes: u64::from(self.cfg.disk_mb) << 20,
            tmp_bytes: u64::from(TMP_MB) << 20,
            default_timeout_ms: u64::try_from(self.cfg.default_timeout.as_millis())
                .unwrap_or(u64::MAX),
            output_bytes: self.cfg.output_bytes,
            pids: self.cfg.pids,
            process_memory_mb: self.cfg.process_memory_mb,
            languages: Some(p.languages.clone()),
            session,
        }
    }

    pub(crate) async fn launch(&self, p: &Proven, session: bool) -> Result<Sandbox, LaunchError> {
        Sandbox::launch(&p.launch, &self.dir, self.spec(p, session)).await
    }

    async fn start(self: &Arc<Self>) -> Result<(), ProviderStartError> {
        seccomp::supported().map_err(start_error)?;
        let bwrap = host::find_bwrap(self.cfg.bwrap.as_deref()).map_err(start_error)?;
        let version = host::check_version(&bwrap).await.map_err(start_error)?;
        let sandboxd = host::find_sandboxd(self.cfg.sandboxd.as_deref()).map_err(start_error)?;
        host::check_userns(
            Path::new("/proc/sys"),
            self.cfg.run_as.is_some() || !crate::config::is_root(),
        )
        .map_err(start_error)?;
        let (uid, gid) = self.cfg.run_as.unwrap_or_else(|| {
            (
                nix::unistd::geteuid().as_raw(),
                nix::unistd::getegid().as_raw(),
            )
        });
        if self.cfg.run_as.is_some() {
            host::check_reachable(&self.dir, uid, gid, "the state directory")
                .map_err(start_error)?;
            host::check_reachable(&sandboxd, uid, gid, "sandboxd").map_err(start_error)?;
        }
        // <instance>/<16 hex>/s/s.sock must fit in a Unix socket address.
        let longest = self
            .dir
            .join("0123456789abcdef")
            .join(crate::command::SOCKET_DIR)
            .join(crate::command::SOCKET_NAME);
        if longest.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(start_error(format!(
                "sandboxd's socket paths would be {} bytes ({}), more than a Unix socket address holds ({MAX_SOCKET_PATH}); choose a shorter PLIMSOLL_STATE_DIR",
                longest.as_os_str().len(),
                longest.display()
            )));
        }
        let limits = self.cfg.cgroup;
        let cgroup = if limits.controllers().is_empty() {
            None
        } else {
            let d = crate::cgroup::find(&limits).map_err(start_error)?;
            d.prepare(&limits)
                .map_err(|e| start_error(format!("cannot prepare the delegated cgroup v2: {e}")))?;
            Some((d, limits))
        };
        let filter = self.dir.join("seccomp.bpf");
        std::fs::write(&filter, seccomp::program())
            .map_err(|e| start_error(format!("cannot write {}: {e}", filter.display())))?;
        let mut proven = Proven {
            launch: Launch {
                bwrap: bwrap.clone(),
                system: crate::command::system_entries(Path::new("/")),
                setpriv: host::on_path("setpriv").or_else(|| {
                    tracing::warn!("util-linux's setpriv is not on PATH: sandboxes rely on bwrap's own --die-with-parent alone to end with plimsolld");
                    None
                }),
                seccomp: filter,
                users: self.cfg.run_as.map(crate::sandbox::Users::new),
                cgroup,
            },
            sandboxd,
            languages: Vec::new(),
            environment: environment(&version),
        };
        // The smoke test: sandboxd proves the languages itself, then one project checks
        // every property of the wall from inside, and the host checks who runs it.
        let mut spec = self.spec(&proven, false);
        spec.languages = None;
        let mut sb = Sandbox::launch(&proven.launch, &self.dir, spec)
            .await
            .map_err(|e| {
                start_error(format!(
                    "the smoke test could not start a sandbox with {}: {e}",
                    bwrap.display()
                ))
            })?;
        let (sb_uid, sb_gid) = sb.ids();
        let host_view = evidence::check_host_view(&sb.host_status(), sb_uid, sb_gid);
        let mut absent: Vec<String> = evidence::HOST_PATHS
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let state = std::path::absolute(&self.cfg.state_dir).ok();
        for p in state.into_iter().chain(std::env::current_dir().ok()) {
            if evidence::host_specific(&p) {
                absent.push(p.display().to_string());
            }
        }
        let answer = sb
            .client()
            .run(
                Work::Project(evidence::smoke_project(&absent)),
                Duration::from_secs(60),
                Vec::new(),
            )
            .await;
        let alive = sb.alive();
        let log = sb.log();
        sb.end().await;
        let answer = match answer {
            Ok(Answer::Project(p)) => p,
            Ok(_) => {
                return Err(start_error(
                    "the smoke run answered a snippet for a project",
                ))
            }
            Err(e) => {
                return Err(start_error(format!(
                    "the smoke run failed: {e}{}{}",
                    if alive { "" } else { " (the sandbox ended)" },
                    if log.trim().is_empty() {
                        String::new()
                    } else {
                        format!("; its log: {}", log.trim())
                    }
                )))
            }
        };
        let facts = evidence::check_smoke(&answer);
        let mut missing = Vec::new();
        if let Err(e) = &host_view {
            missing.push(e.clone());
        }
        let mut landlock = false;
        match facts {
            Ok(f) => {
                proven.languages = f.languages;
                landlock = f.landlock;
            }
            Err(e) => missing.push(e),
        }
        if !missing.is_empty() {
            return Err(start_error(format!(
                "the smoke test did not prove the wall for tier container: {}",
                missing.join("; ")
            )));
        }
        if landlock {
            proven.environment.push_str(";landlock");
        } else {
            tracing::warn!("the Landlock layer did not hold (the kernel offers no Landlock?): files written by runs can be executed; the namespaces and the seccomp filter still hold");
        }
        let mut held = vec!["processes (SANDBOX_PIDS)", "/work size (SANDBOX_DISK_MB)"];
        if limits.memory_mb > 0 {
            held.push("memory (SANDBOX_MEMORY_MB, cgroup v2)");
        } else if self.cfg.process_memory_mb > 0 {
            held.push("memory per process (SANDBOX_MEMORY_MB, RLIMIT_AS and RLIMIT_DATA)");
        }
        if limits.cpus > 0.0 {
            held.push("CPU (SANDBOX_CPUS, cgroup v2)");
        }
        let not_held = match (limits.memory_mb > 0, limits.cpus > 0.0) {
            (true, true) => "",
            (true, false) => "; CPU is not limited (SANDBOX_CPUS unset)",
            (false, true) if self.cfg.process_memory_mb > 0 => "; memory is bounded per process only (no delegated cgroup v2 for SANDBOX_MEMORY_MB), not in total",
            (false, true) => "; memory is not limited (SANDBOX_MEMORY_MB unset)",
            (false, false) if self.cfg.process_memory_mb > 0 => "; CPU is not limited (SANDBOX_CPUS needs a delegated cgroup v2) and memory is bounded per process only, not in total",
            (false, false) => "; memory and CPU are not limited (they need SANDBOX_MEMORY_MB / SANDBOX_CPUS and a delegated cgroup v2)",
        };
        tracing::info!(
            landlock,
            bwrap = %bwrap.display(),
            version = %version,
            environment = %proven.environment,
            languages = ?proven.languages,
            host_user = %match self.cfg.run_as {
                Some((u, g)) => format!("{u}:{g} and up, one per sandbox"),
                None => format!("{uid}:{gid}"),
            },
            pids = self.cfg.pids,
            disk_mb = self.cfg.disk_mb,
            memory_mb = limits.memory_mb,
            process_memory_mb = self.cfg.process_memory_mb,
            cpus = limits.cpus,
            "bwrap provider proved its wall (tier container); limits held: {}{not_held}",
            held.join(", ")
        );
        // The memory bound in words (an embedded daemon's caller prints it after its first
        // line, so it is not a warning that would come before that line).
        tracing::info!("{}", self.cfg.memory_statement());
        let _ = self.proven.set(proven);
        if self.cfg.pool > 0 {
            let me = Arc::downgrade(self);
            tokio::spawn(async move { refill_loop(me).await });
        }
        Ok(())
    }

    /// A sandbox for one run: from the pool, else a fresh one.
    async fn take(&self, p: &Proven) -> Result<Sandbox, LaunchError> {
        loop {
            let next = self.lock_pool().pop_front();
            self.refill.notify_one();
            match next {
                Some(mut s) => {
                    if s.alive() {
                        return Ok(s);
                    }
                    // A pool member that died while it waited was sent nothing.
                    s.end().await;
                }
                None => return self.launch(p, false).await,
            }
        }
    }

    pub(crate) async fn run(
        &self,
        work: Work,
        timeout: Duration,
        env: Vec<(String, String)>,
        grant: Option<plimsoll_grants::RunGrant>,
    ) -> Result<Answer, ProviderError> {
        let Some(p) = self.proven.get() else {
            return Err(Refusal::environment("the bwrap provider has not started").into());
        };
        if self.closed.load(Ordering::SeqCst) {
            return Err(Refusal::environment("the bwrap provider is stopping").into());
        }
        RunEnv::new(env.clone())
            .map_err(|e| ProviderError::Refused(Refusal::request(e.to_string())))?;
        let sb = self.take(p).await.map_err(|e| {
            ProviderError::Refused(Refusal::environment(format!("no sandbox for the run: {e}")))
        })?;
        let mut env = env;
        let relay = match &grant {
            None => None,
            Some(g) => match plimsoll_grants::prepare::unix_socket(
                g,
                sb.dir(),
                GRANT_SOCKET_NAME,
                CHANNEL_DIR,
            )
            .await
            {
                Ok(prepared) => {
                    env.extend_from_slice(prepared.vars());
                    Some(prepared)
                }
                Err(e) => {
                    sb.end().await;
                    return Err(Refusal::environment(format!(
                        "the bwrap provider could not prepare the run's grant: {e}"
                    ))
                    .into());
                }
            },
        };
        let outcome = tokio::time::timeout(
            timeout + DEADLINE_GRACE,
            sb.client().run(work, timeout, env),
        )
        .await;
        if let Some(relay) = relay {
            relay.close().await;
        }
        // Every process of the run ends with its PID namespace, before the answer.
        sb.end().await;
        match outcome {
            Err(_) => Err(ProviderError::Failed(format!(
                "the sandbox did not answer within the deadline ({timeout:?}) plus {DEADLINE_GRACE:?} and was killed; the code may have run"
            ))),
            Ok(Ok(a)) => Ok(a),
            Ok(Err(e)) => Err(call_error(e)),
        }
    }
}

/// A sandboxd call failure as the provider reports it.
pub(crate) fn call_error(e: CallError) -> ProviderError {
    match e.refusal() {
        Some(r) => r.into(),
        None => ProviderError::Failed(e.to_string()),
    }
}

/// Keeps the warm pool at its size while the provider lives.
async fn refill_loop(me: std::sync::Weak<Inner>) {
    loop {
        let Some(inner) = me.upgrade() else { return };
        if inner.closed.load(Ordering::SeqCst) {
            return;
        }
        let have = inner.lock_pool().len() + inner.launching.load(Ordering::SeqCst);
        if have < inner.cfg.pool {
            let Some(p) = inner.proven.get().cloned() else {
                return;
            };
            inner.launching.fetch_add(1, Ordering::SeqCst);
            let launched = inner.launch(&p, false).await;
            inner.launching.fetch_sub(1, Ordering::SeqCst);
            match launched {
                Ok(s) => {
                    // Checked under the pool's lock: shutdown sets `closed`, then drains
                    // under the same lock, so a sandbox is either drained or never pooled.
                    let refused = {
                        let mut pool = inner.lock_pool();
                        if inner.closed.load(Ordering::SeqCst) {
                            Some(s)
                        } else {
                            pool.push_back(s);
                            None
                        }
                    };
                    if let Some(s) = refused {
                        s.end().await;
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not start a sandbox for the warm pool");
                    drop(inner);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
            continue;
        }
        // Woken by a run that took a sandbox, by shutdown, or once a second to notice the
        // provider was dropped.
        let wait = Arc::clone(&inner);
        drop(inner);
        let _ = tokio::time::timeout(Duration::from_secs(1), wait.refill.notified()).await;
    }
}

#[async_trait::async_trait]
impl Provider for BwrapProvider {
    fn facts(&self) -> Facts {
        let p = self.inner.proven.get();
        Facts {
            name: NAME.into(),
            tier: p.map(|_| Tier::Container),
            environment: p.map(|p| p.environment.clone()).unwrap_or_default(),
            software_identity: String::new(),
            languages: p.map(|p| p.languages.clone()).unwrap_or_default(),
            supports_project: true,
            max_timeout_ms: plimsoll_core::validate::MAX_TIMEOUT_MS,
            policy: String::new(),
            supports_grants: true,
        }
    }

    async fn start(&self) -> Result<(), ProviderStartError> {
        self.inner.start().await
    }

    async fn ready(&self) -> bool {
        self.inner.proven.get().is_some() && !self.inner.closed.load(Ordering::SeqCst)
    }

    async fn stop(&self) {
        self.shutdown().await;
    }

    fn sessions(&self) -> Option<&dyn SessionProvider> {
        Some(self)
    }

    async fn run(&self, work: Work, timeout: Duration) -> Result<Answer, ProviderError> {
        self.inner.run(work, timeout, Vec::new(), None).await
    }

    /// The relay is a Unix socket (`g.sock`) in the run's directory, which the sandbox sees
    /// at `/run/plimsoll` (it has no network but loopback; this socket is its one way out,
    /// and it leads only to the broker). The clients are written beside it and named by
    /// `PLIMSOLL_GRANT_JS` / `PLIMSOLL_GRANT_PY`; a project also gets them at the top of its
    /// working directory. The relay closes when the run ends.
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

impl Drop for Inner {
    fn drop(&mut self) {
        // Pool members are killed as their `Child` drops (kill_on_drop); their directories
        // and this start's go with the instance directory.
        self.lock_pool().clear();
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(self.dir.with_extension("lock"));
    }
}
