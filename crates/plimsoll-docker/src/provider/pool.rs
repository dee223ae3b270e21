//! Containers, from launch to removal: a launch (run directory with the token, create,
//! start, wait for sandboxd's socket, lock the directory), the sandboxd connection, the warm
//! pool and its refill, removal now or in the background, and the shutdown and drop that
//! remove every container of this instance.

use std::collections::{HashSet, VecDeque};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use plimsoll_sandboxd::{CallError, SandboxdClient, Token};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{random_hex, Inner, Warm, READY_TIMEOUT, SHUTDOWN_WAIT};
use crate::engine::{self, connect, Spec, LABEL_INSTANCE, SOCKET_NAME, TOKEN_NAME};
use crate::error::Error;
use crate::state::make_removable;

/// Counts one launch in flight until dropped (also when the launch's future is dropped).
struct Launching<'a>(&'a Inner);

impl Drop for Launching<'_> {
    fn drop(&mut self) {
        self.0.launching.fetch_sub(1, Ordering::SeqCst);
        self.0.launched.notify_waiters();
    }
}

/// Waits until `count` is zero; whoever lowers it notifies `lowered`'s waiters.
async fn until_zero(count: &AtomicUsize, lowered: &Notify) {
    loop {
        let wait = lowered.notified();
        if count.load(Ordering::SeqCst) == 0 {
            return;
        }
        wait.await;
    }
}

impl Inner {
    pub(super) fn lock_pool(&self) -> std::sync::MutexGuard<'_, VecDeque<Warm>> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn lock_session_pool(&self) -> std::sync::MutexGuard<'_, VecDeque<Warm>> {
        self.session_pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pool of runs' containers, or of sessions' (`session`), and what wakes its refill.
    fn pool_of(&self, session: bool) -> (std::sync::MutexGuard<'_, VecDeque<Warm>>, &Notify) {
        if session {
            (self.lock_session_pool(), &self.session_refill)
        } else {
            (self.lock_pool(), &self.refill)
        }
    }

    fn lock_live(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until no launch is in flight.
    async fn launches_done(&self) {
        until_zero(&self.launching, &self.launched).await;
    }

    /// Waits until every container removal started so far has finished.
    pub(super) async fn settle(&self) {
        until_zero(&self.removing, &self.removed).await;
    }

    /// `DockerProvider::shutdown` (its documentation states the order).
    pub(super) async fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.refill.notify_one();
        self.session_refill.notify_one();
        let mut warm: Vec<Warm> = self.lock_pool().drain(..).collect();
        warm.extend(self.lock_session_pool().drain(..));
        for w in warm {
            self.discard(w).await;
        }
        let in_flight = async {
            self.launches_done().await;
            self.settle().await;
        };
        if tokio::time::timeout(SHUTDOWN_WAIT, in_flight)
            .await
            .is_err()
        {
            tracing::warn!(
                launching = self.launching.load(Ordering::SeqCst),
                removing = self.removing.load(Ordering::SeqCst),
                wait_s = SHUTDOWN_WAIT.as_secs(),
                "container launches or removals still in flight at shutdown; removing this instance's containers by label"
            );
        }
        match tokio::time::timeout(SHUTDOWN_WAIT, self.remove_instance()).await {
            Ok(Ok(0)) => {
                tracing::info!(instance = %self.instance.id(), "docker provider stopped; no container of this instance is left")
            }
            Ok(Ok(n)) => tracing::error!(instance = %self.instance.id(), left = n,
                "containers of this instance could not be removed at shutdown; the next start with this state directory removes them"),
            Ok(Err(e)) => tracing::error!(instance = %self.instance.id(), error = %e,
                "cannot list this instance's containers at shutdown; the next start with this state directory removes them"),
            Err(_) => {
                tracing::error!(instance = %self.instance.id(), wait_s = SHUTDOWN_WAIT.as_secs(),
                "the engine did not finish removing this instance's containers at shutdown; the next start with this state directory removes them")
            }
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

    /// At drop: marks the provider closed and removes every container it still knows of.
    /// Drop cannot await: a short-lived thread with its own runtime removes them. Whatever
    /// it misses, the next start with this state directory removes.
    pub(super) fn remove_at_drop(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.refill.notify_one();
        self.session_refill.notify_one();
        let mut ids: Vec<String> = self.lock_live().drain().collect();
        ids.extend(self.lock_pool().drain(..).map(|w| w.id));
        ids.extend(self.lock_session_pool().drain(..).map(|w| w.id));
        ids.sort();
        ids.dedup();
        if ids.is_empty() {
            return;
        }
        let socket = self.socket.clone();
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

    pub(super) fn spec<'a>(
        &'a self,
        image_id: &'a str,
        run_id: &'a str,
        dir: &'a Path,
    ) -> Spec<'a> {
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
            session: false,
        }
    }

    /// Creates, starts and waits for one container of `image_id`. Refused once the provider
    /// is closed; a launch that began before sees it at its next step and removes its
    /// container.
    pub(super) async fn launch(&self, image_id: &str) -> Result<Warm, Error> {
        self.launch_as(image_id, false).await
    }

    /// [`launch`](Self::launch) of a run's container, or with `session` of a session's
    /// (sandboxd with `--session`, labelled as a session's; never put in the warm pool).
    pub(super) async fn launch_as(&self, image_id: &str, session: bool) -> Result<Warm, Error> {
        // Counted before `closed` is read: shutdown sets `closed` before it reads the count,
        // so either this launch sees it closed or shutdown waits for this launch.
        self.launching.fetch_add(1, Ordering::SeqCst);
        let _counted = Launching(self);
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::ShuttingDown);
        }
        let run_id = random_hex();
        let dir = self.instance.dir().join(&run_id);
        let token = Token::new(random_hex())?;
        let prepare = || -> std::io::Result<()> {
            std::fs::create_dir(&dir)?;
            // The guest user must create its socket here; locked again once it has.
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))?;
            let tf = dir.join(TOKEN_NAME);
            std::fs::write(&tf, format!("{}\n", token.expose()))?;
            std::fs::set_permissions(&tf, std::fs::Permissions::from_mode(0o644))
        };
        if let Err(source) = prepare() {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(Error::RunDir { dir, source });
        }
        let mut spec = self.spec(image_id, &run_id, &dir);
        spec.session = session;
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
            return Err(Error::ShuttingDown);
        }
        match self.wait_ready(&warm).await {
            Ok(()) => Ok(warm),
            Err(e) if self.closed.load(Ordering::SeqCst) => {
                self.discard(warm).await;
                Err(e)
            }
            Err(e) => {
                let log = engine::log_tail(&self.docker, &warm.id).await;
                self.discard(warm).await;
                Err(if log.is_empty() {
                    e
                } else {
                    Error::WithLog {
                        source: Box::new(e),
                        log,
                    }
                })
            }
        }
    }

    /// Waits for sandboxd's socket, then deletes the token file and locks the directory so
    /// nothing in the container can write to the host again.
    async fn wait_ready(&self, w: &Warm) -> Result<(), Error> {
        let sock = w.dir.join(SOCKET_NAME);
        let start = Instant::now();
        let mut next_check = start + Duration::from_millis(250);
        loop {
            if std::fs::symlink_metadata(&sock).is_ok() {
                break;
            }
            if self.closed.load(Ordering::SeqCst) {
                return Err(Error::ShuttingDown);
            }
            let now = Instant::now();
            if now - start > READY_TIMEOUT {
                return Err(Error::ReadyTimeout);
            }
            if now >= next_check {
                next_check = now + Duration::from_millis(250);
                let state = self
                    .docker
                    .inspect_container(&w.id, None)
                    .await
                    .map_err(Error::Lost)?
                    .state;
                let running = state.as_ref().and_then(|s| s.running).unwrap_or(false);
                if !running {
                    return Err(Error::Stopped {
                        exit_code: state.and_then(|s| s.exit_code).unwrap_or(-1),
                    });
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        // sandboxd read the token before it bound the socket.
        let _ = std::fs::remove_file(w.dir.join(TOKEN_NAME));
        std::fs::set_permissions(&w.dir, std::fs::Permissions::from_mode(0o755)).map_err(
            |source| Error::Lock {
                dir: w.dir.clone(),
                source,
            },
        )?;
        Ok(())
    }

    /// Connects to a ready container's sandboxd. A failure sent nothing.
    pub(super) async fn connect(&self, w: &Warm) -> Result<SandboxdClient, CallError> {
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
    pub(super) async fn discard(&self, w: Warm) {
        tracing::debug!(run = %w.run_id, container = %engine::short(&w.id), "removing a used sandbox container");
        engine::remove(&self.docker, &w.id).await;
        self.lock_live().remove(&w.id);
        make_removable(&w.dir);
        let _ = std::fs::remove_dir_all(&w.dir);
    }

    /// Removes a container in the background (the answer does not wait for it).
    pub(super) fn discard_later(self: &Arc<Self>, w: Warm) {
        self.removing.fetch_add(1, Ordering::SeqCst);
        let me = self.clone();
        tokio::spawn(async move {
            me.discard(w).await;
            me.removing.fetch_sub(1, Ordering::SeqCst);
            me.removed.notify_waiters();
        });
    }

    /// A ready container, and whether it came from the warm pool (else it is fresh).
    pub(super) async fn take(&self, image_id: &str) -> Result<(Warm, bool), Error> {
        self.take_of(image_id, false).await
    }

    /// [`Inner::take`] from the runs' pool, or (`session`) from the never-used session
    /// containers; a fresh container of that kind when the pool is empty.
    pub(super) async fn take_of(
        &self,
        image_id: &str,
        session: bool,
    ) -> Result<(Warm, bool), Error> {
        let pooled = {
            let (mut pool, refill) = self.pool_of(session);
            let w = pool.pop_front();
            if w.is_some() {
                refill.notify_one();
            }
            w
        };
        if let Some(w) = pooled {
            return Ok((w, true));
        }
        self.launch_as(image_id, session).await.map(|w| (w, false))
    }

    /// Keeps the runs' warm pool (`SANDBOX_DOCKER_POOL`), or the never-used session
    /// containers (`session`, `SANDBOX_SESSION_POOL`), at its size until the provider
    /// closes, backing off while launches fail.
    pub(super) fn spawn_refill(self: &Arc<Self>, image_id: String, session: bool) {
        let want = if session {
            self.cfg.session_pool
        } else {
            self.cfg.pool
        };
        if want == 0 {
            return;
        }
        let weak = Arc::downgrade(self);
        let refill = if session {
            self.session_refill.clone()
        } else {
            self.refill.clone()
        };
        tokio::spawn(async move {
            let mut failures = 0u32;
            loop {
                let Some(me) = weak.upgrade() else { return };
                if me.closed.load(Ordering::SeqCst) {
                    return;
                }
                if me.pool_of(session).0.len() >= want {
                    drop(me);
                    refill.notified().await;
                    continue;
                }
                match me.launch_as(&image_id, session).await {
                    Ok(w) => {
                        failures = 0;
                        if me.closed.load(Ordering::SeqCst) {
                            me.discard(w).await;
                            return;
                        }
                        me.pool_of(session).0.push_back(w);
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
