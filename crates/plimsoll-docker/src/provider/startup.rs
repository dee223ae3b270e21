//! The startup checks: the configuration (`DockerProvider::new`: nothing asked of the
//! engine yet), then, in this order, in `Provider::start`: the engine answers and states its
//! API version, the runtime is listed (runsc as runsc, with the arguments the provider
//! needs), the image is resolved to its content ID and has no loader variable or volume,
//! ended starts' containers are removed, and the smoke test runs one real container
//! exactly as runs get it (hardening, languages, gVisor for runsc). Only then is anything
//! proven and the warm pool filled.

use std::collections::{HashSet, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex, OnceLock};

use plimsoll_core::sandboxd_pb::{execute_request, execute_response, ExecuteRequest};
use plimsoll_core::Tier;
use tokio::sync::Notify;

use super::{environment, random_hex, Inner, Proven, MAX_SOCKET_PATH};
use crate::config::{DockerConfig, Runtime, Seccomp};
use crate::engine::{self, connect, LABEL_INSTANCE, SOCKET_NAME};
use crate::error::Error;
use crate::evidence;
use crate::state::Instance;

impl Inner {
    /// Checks the configuration, reads the seccomp profile, claims this start's instance in
    /// the state directory. Nothing is asked of the engine.
    pub(super) fn new(cfg: DockerConfig) -> Result<Inner, Error> {
        if cfg.image.trim().is_empty() {
            return Err(Error::ImageUnset);
        }
        if cfg.pool > crate::config::MAX_POOL {
            return Err(Error::PoolTooLarge {
                pool: cfg.pool,
                max: crate::config::MAX_POOL,
            });
        }
        let limits = cfg
            .limits()
            .map_err(|(var, message)| Error::Setting { var, message })?;
        let socket = cfg.socket_path().map_err(Error::Socket)?;
        let seccomp_json = match &cfg.seccomp {
            Seccomp::Plimsoll => Some(plimsoll_provider::seccomp::docker_profile()),
            Seccomp::EngineDefault => None,
            Seccomp::File(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| Error::SeccompRead {
                    path: p.clone(),
                    source,
                })?;
                serde_json::from_str::<serde_json::Value>(&text).map_err(|source| {
                    Error::SeccompJson {
                        path: p.clone(),
                        source,
                    }
                })?;
                Some(text)
            }
        };
        let docker = connect(&socket)?;
        let instance = Instance::claim(&cfg.state_dir).map_err(|source| Error::StateDir {
            dir: cfg.state_dir.clone(),
            source,
        })?;
        let longest = instance
            .dir()
            .join(random_hex())
            .join(SOCKET_NAME)
            .as_os_str()
            .len();
        if longest > MAX_SOCKET_PATH {
            return Err(Error::StateDirTooLong {
                dir: cfg.state_dir.clone(),
                longest,
            });
        }
        Ok(Inner {
            cfg,
            limits,
            seccomp_json,
            docker,
            socket,
            instance,
            proven: OnceLock::new(),
            pool: Mutex::new(VecDeque::new()),
            refill: Arc::new(Notify::new()),
            session_pool: Mutex::new(VecDeque::new()),
            session_refill: Arc::new(Notify::new()),
            live: Mutex::new(HashSet::new()),
            removing: AtomicUsize::new(0),
            removed: Notify::new(),
            launching: AtomicUsize::new(0),
            launched: Notify::new(),
            closed: AtomicBool::new(false),
        })
    }

    /// `Provider::start`: the engine's checks in order, then what they proved is kept and
    /// the warm pool starts filling.
    pub(super) async fn start(self: &Arc<Self>) -> Result<(), Error> {
        let socket = self.socket.display().to_string();
        self.docker.ping().await.map_err(|source| Error::Ping {
            socket: socket.clone(),
            source,
        })?;
        let docker = self
            .docker
            .clone()
            .negotiate_version()
            .await
            .map_err(|source| Error::Version { socket, source })?;
        // The negotiated client shares the connection pool; later calls use that version.
        drop(docker);
        let grants = self.verify_runtime().await?;
        let image_id = self.verify_image().await?;
        let removed = self.reconcile().await?;
        // The image is scanned before any container of it starts, the smoke test's included.
        if let Some(w) = &self.cfg.withheld {
            crate::scan::run(&self.docker, &image_id, w)
                .await
                .map_err(Error::ShipScan)?;
        }
        let (languages, tier) = self.smoke(&image_id).await?;
        let policy = self.lockdown_digest(&image_id);
        tracing::info!(image = %image_id, isolation = %tier, languages = ?languages, instance = %self.instance.id(),
            orphans_removed = removed, pool = self.cfg.pool, "docker provider smoke test passed");
        let _ = self.proven.set(Proven {
            environment: environment(&image_id, self.cfg.runtime),
            image_id: image_id.clone(),
            tier,
            grants,
            languages,
            policy,
        });
        self.spawn_refill(image_id.clone(), false);
        self.spawn_refill(image_id, true);
        Ok(())
    }

    /// Removes every container of ended daemon starts recorded in this state directory.
    async fn reconcile(&self) -> Result<usize, Error> {
        let ended =
            self.instance
                .ended(&self.cfg.state_dir)
                .map_err(|source| Error::StateRead {
                    dir: self.cfg.state_dir.clone(),
                    source,
                })?;
        let mut removed = 0;
        for e in ended {
            let ids = engine::containers_labelled(&self.docker, LABEL_INSTANCE, &e.id)
                .await
                .map_err(Error::List)?;
            for id in &ids {
                engine::remove(&self.docker, id).await;
            }
            let left = engine::containers_labelled(&self.docker, LABEL_INSTANCE, &e.id)
                .await
                .map_err(Error::List)?;
            if !left.is_empty() {
                return Err(Error::Leftover {
                    count: left.len(),
                    instance: e.id.clone(),
                });
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
    async fn verify_image(&self) -> Result<String, Error> {
        let image = &self.cfg.image;
        let img = self.docker.inspect_image(image).await.map_err(|source| {
            if engine::is_not_found(&source) {
                Error::ImageMissing {
                    image: image.clone(),
                }
            } else {
                Error::ImageInspect {
                    image: image.clone(),
                    source,
                }
            }
        })?;
        let id = img
            .id
            .filter(|i| i.starts_with("sha256:"))
            .ok_or_else(|| Error::NoContentId {
                image: image.clone(),
            })?;
        let config = img.config.unwrap_or_default();
        let refused = evidence::refused_image_env(config.env.as_deref().unwrap_or_default());
        if !refused.is_empty() {
            return Err(Error::ImageEnv {
                image: engine::short(&id).to_owned(),
                names: refused.join(", "),
            });
        }
        if let Some(v) = config.volumes.filter(|v| !v.is_empty()) {
            return Err(Error::ImageVolume {
                image: engine::short(&id).to_owned(),
                volumes: format!("{v:?}"),
            });
        }
        Ok(id)
    }

    /// The runtime the configuration names must be listed by the engine; a runsc runtime
    /// must be runsc and be registered with the arguments the provider needs
    /// ([`evidence::check_runsc_args`]). Returns whether runs can reach a grant relay.
    async fn verify_runtime(&self) -> Result<bool, Error> {
        let info = self.docker.info().await.map_err(Error::Info)?;
        let runtimes = info.runtimes.unwrap_or_default();
        let want = self.cfg.engine_runtime();
        let var = format!("SANDBOX_DOCKER_RUNTIME={}", self.cfg.runtime.as_str());
        let Some(rt) = runtimes.get(want) else {
            let mut listed: Vec<String> = runtimes.keys().cloned().collect();
            listed.sort();
            return Err(Error::RuntimeNotListed {
                var,
                want: want.to_owned(),
                listed,
                hint: if self.cfg.runtime == Runtime::Runsc {
                    format!("; install gVisor's runsc (apt-get install runsc) and add \"runtimes\": {{\"{want}\": {{\"path\": \"/usr/bin/runsc\", \"runtimeArgs\": [\"--network=none\", \"--host-uds=all\"]}}}} to /etc/docker/daemon.json, then send SIGHUP to dockerd (.ci/register-runsc does both)")
                } else {
                    String::new()
                },
            });
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
            return Err(Error::NotRunsc {
                var,
                want: want.to_owned(),
                path,
            });
        }
        let args = rt.runtime_args.clone().unwrap_or_default();
        let channel = evidence::check_runsc_args(want, &path, &args)
            .map_err(|why| Error::RunscArgs { var, why })?;
        if !channel.grants {
            tracing::warn!(runtime = want, args = ?args, "runsc runs with --host-uds=create: code cannot reach a grant relay's socket, so this provider offers no grants (use --host-uds=all to offer them)");
        }
        Ok(channel.grants)
    }

    /// The policy digest the provider states: the lockdown every run's container gets.
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
    async fn smoke(&self, image_id: &str) -> Result<(Vec<String>, Tier), Error> {
        let w = self
            .launch(image_id)
            .await
            .map_err(|source| Error::SmokeLaunch {
                image: engine::short(image_id).to_owned(),
                source: Box::new(source),
            })?;
        let result = async {
            let client = self.connect(&w).await.map_err(Error::Sandboxd)?;
            let health = client.health().await.map_err(Error::Sandboxd)?;
            let resp = client
                .execute(ExecuteRequest {
                    timeout_ms: 60_000,
                    env: vec![],
                    trace_id: "plimsoll-docker-smoke".into(),
                    payload: Some(execute_request::Payload::Project(evidence::smoke_project())),
                })
                .await
                .map_err(Error::Sandboxd)?;
            let Some(execute_response::Result::Project(p)) = resp.result else {
                return Err(Error::SmokeNoProject);
            };
            let facts = evidence::check_smoke(&p).map_err(Error::Smoke)?;
            let tier = match self.cfg.runtime {
                Runtime::Runc => Tier::Container,
                Runtime::Runsc => {
                    let host = std::fs::read_to_string("/proc/version").unwrap_or_default();
                    let why = evidence::gvisor_evidence(&facts.proc_version, &facts.dmesg, &host)
                        .map_err(Error::Gvisor)?;
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
}
