//! The Docker Engine API, narrowed to what the provider does: connect, read facts, create,
//! start, kill and remove containers carrying this daemon's labels. The container
//! specification is a pure function ([`container_body`]) so its lockdown is unit-tested.

use std::collections::HashMap;
use std::path::Path;

use bollard::models::{
    ContainerCreateBody, ContainerInspectResponse, HostConfig, HostConfigLogConfig, Mount,
    MountBindOptions, MountBindOptionsPropagationEnum, MountType, ResourcesUlimits,
};
use bollard::query_parameters::{
    CreateContainerOptions, KillContainerOptions, ListContainersOptions, LogsOptions,
    RemoveContainerOptions,
};
use bollard::Docker;
use futures_util::StreamExt;

use crate::config::Limits;
use crate::error::Error;

/// Label naming the daemon start that created a container (random per start).
pub const LABEL_INSTANCE: &str = "io.plimsoll.instance";
/// Label naming the run (or pool slot) a container serves.
pub const LABEL_RUN: &str = "io.plimsoll.run";
/// Label of a session's container (value `1`): its sandboxd runs with `--session` and it
/// serves one session only. It carries [`LABEL_INSTANCE`] too, so shutdown and the next
/// start's reconciliation remove it like any other.
pub const LABEL_SESSION: &str = "io.plimsoll.session";
/// The user every container runs as: not root, not a system account.
pub const GUEST_USER: &str = "61000:61000";
/// Where the per-run host directory (sandboxd's socket) is mounted in the container.
pub const CHANNEL_DIR: &str = "/run/plimsoll";
/// sandboxd's socket, inside [`CHANNEL_DIR`].
pub const SOCKET_NAME: &str = "sd.sock";
/// The per-run token file, inside [`CHANNEL_DIR`] until sandboxd has read it.
pub const TOKEN_NAME: &str = "token";
/// sandboxd inside the image.
pub const SANDBOXD_PATH: &str = "/usr/local/bin/plimsoll-sandboxd";
/// sandboxd's run root inside the container (a tmpfs).
pub const WORK_DIR: &str = "/work";

/// Host tasks gVisor's sentry needs besides the guest's: measured at 44 for a sandbox
/// running one shell (runsc 2022-12, ptrace platform), with room to spare.
pub const GVISOR_BASE_TASKS: u32 = 64;
/// Host tasks gVisor's ptrace platform spends per guest task, at most: each guest address
/// space is a stub process with threads of its own (measured: about 15 per process that
/// executes a program, 5 per forked Python, 0.15 per thread of one process).
pub const GVISOR_TASKS_PER_GUEST_TASK: u32 = 16;
/// Host memory gVisor's ptrace platform spends per guest process, in MiB, rounded up
/// (measured: 3.3 per forked Python process, counted in the container's memory cgroup).
pub const GVISOR_MIB_PER_GUEST_TASK: u32 = 6;

/// The bounds a container gets from inside gVisor's kernel, under runsc: `(processes,
/// MiB per process)` for sandboxd's `--max-processes` and `--max-memory-mb`.
///
/// Under runsc the container's cgroups hold gVisor itself, not the guest's processes, and
/// when the host refuses gVisor a task or a page, gVisor does not fail the guest's call: the
/// sentry panics ("error initializing first thread: resource temporarily unavailable") or
/// is killed by the cgroup's OOM killer, and the sandbox dies with the run's answer (the
/// "lost channel" of issue 38). gVisor's own kernel refuses cleanly, with `EAGAIN` for
/// `RLIMIT_NPROC` and `ENOMEM` for `RLIMIT_AS` (it does not enforce `RLIMIT_DATA`), so
/// each bound is set there, below what the cgroups allow:
/// - processes and threads: `SANDBOX_PIDS`, and at most one per
///   [`GVISOR_MIB_PER_GUEST_TASK`] MiB of `SANDBOX_MEMORY_MB` (85 at the default 512), so
///   what gVisor spends on them fits in the memory limit;
/// - address space per process: three quarters of `SANDBOX_MEMORY_MB`, at least 384 MiB
///   (node reserves 352 to start): one process cannot take the whole container. A
///   bound per process, not in total: several processes together can still reach the
///   memory limit, and the sandbox is then killed.
pub fn gvisor_bounds(limits: &Limits) -> (u32, u32) {
    let processes = limits
        .pids
        .min(limits.memory_mb / GVISOR_MIB_PER_GUEST_TASK)
        .max(16);
    let memory = (limits.memory_mb / 4 * 3).max(384);
    (processes, memory)
}

/// The container's pids cgroup limit: `SANDBOX_PIDS` under runc; under runsc a host bound
/// above what the guest's process limit ([`gvisor_bounds`]) can cost gVisor.
pub fn pids_cgroup_limit(runtime: &str, limits: &Limits) -> i64 {
    if runtime == "runsc" {
        let (processes, _) = gvisor_bounds(limits);
        i64::from(GVISOR_BASE_TASKS) + i64::from(GVISOR_TASKS_PER_GUEST_TASK) * i64::from(processes)
    } else {
        i64::from(limits.pids)
    }
}

/// How long the engine is given for one API call before it is treated as unreachable.
pub const API_TIMEOUT_S: u64 = 60;

/// Everything that varies between containers of one provider.
#[derive(Debug, Clone)]
pub struct Spec<'a> {
    /// The verified image content ID (`sha256:…`).
    pub image_id: &'a str,
    /// The engine's name for the OCI runtime (`runc`, `runsc`, …).
    pub runtime: &'a str,
    /// Resource limits.
    pub limits: Limits,
    /// A seccomp profile's JSON, or `None` for the engine's default profile.
    pub seccomp_json: Option<&'a str>,
    /// This daemon start's instance id.
    pub instance: &'a str,
    /// The run id.
    pub run_id: &'a str,
    /// The per-run host directory mounted at [`CHANNEL_DIR`].
    pub host_dir: &'a Path,
    /// sandboxd's default deadline.
    pub default_timeout_ms: u64,
    /// Bytes kept per output stream per program.
    pub output_bytes: usize,
    /// Languages the startup smoke test proved on this same image ID, handed to sandboxd so
    /// it need not prove them again in every container; `None` (the smoke test itself)
    /// makes sandboxd prove them.
    pub languages: Option<&'a [String]>,
    /// A session's container: sandboxd runs with `--session`, labelled [`LABEL_SESSION`].
    pub session: bool,
}

/// The container name for a run id.
pub fn container_name(run_id: &str) -> String {
    format!("plimsoll-{run_id}")
}

fn tmpfs_opts(size_mb: u32, extra: &str) -> String {
    format!("rw,noexec,nosuid,nodev,size={size_mb}m{extra}")
}

/// The locked-down container: no network, read-only root, size-limited noexec tmpfs
/// mounts, every capability dropped, no new privileges, a non-root user, pids/memory/CPU
/// limits, the default (or given) seccomp profile, and one host mount: the per-run
/// directory holding sandboxd's socket. sandboxd is the entrypoint.
pub fn container_body(s: &Spec<'_>) -> ContainerCreateBody {
    let mem = i64::from(s.limits.memory_mb) * 1024 * 1024;
    let mut security_opt = vec!["no-new-privileges:true".to_owned()];
    if let Some(json) = s.seccomp_json {
        security_opt.push(format!("seccomp={json}"));
    }
    let tmpfs = HashMap::from([
        ("/tmp".to_owned(), tmpfs_opts(s.limits.tmp_mb, "")),
        ("/dev/shm".to_owned(), tmpfs_opts(s.limits.shm_mb, "")),
        (
            WORK_DIR.to_owned(),
            tmpfs_opts(s.limits.work_mb, ",mode=1777"),
        ),
    ]);
    let mut labels = HashMap::from([
        (LABEL_INSTANCE.to_owned(), s.instance.to_owned()),
        (LABEL_RUN.to_owned(), s.run_id.to_owned()),
    ]);
    if s.session {
        labels.insert(LABEL_SESSION.to_owned(), "1".to_owned());
    }
    let socket = format!("{CHANNEL_DIR}/{SOCKET_NAME}");
    let token = format!("{CHANNEL_DIR}/{TOKEN_NAME}");
    let cmd = vec![
        "--unix-socket".to_owned(),
        socket,
        "--token-file".to_owned(),
        token,
        "--root-dir".to_owned(),
        WORK_DIR.to_owned(),
        "--default-timeout-ms".to_owned(),
        s.default_timeout_ms.to_string(),
        "--output-bytes".to_owned(),
        s.output_bytes.to_string(),
        "--log-format".to_owned(),
        "json".to_owned(),
    ];
    let mut cmd = cmd;
    if let Some(langs) = s.languages {
        cmd.push("--languages".to_owned());
        cmd.push(if langs.is_empty() {
            "none".to_owned()
        } else {
            langs.join(",")
        });
    }
    if s.session {
        cmd.push("--session".to_owned());
    }
    if s.runtime == "runsc" {
        // Bounded inside gVisor's kernel, where a refusal is an error the code sees
        // ([`gvisor_bounds`]).
        let (processes, memory_mb) = gvisor_bounds(&s.limits);
        cmd.push("--max-processes".to_owned());
        cmd.push(processes.to_string());
        cmd.push("--max-memory-mb".to_owned());
        cmd.push(memory_mb.to_string());
    }
    ContainerCreateBody {
        image: Some(s.image_id.to_owned()),
        entrypoint: Some(vec![SANDBOXD_PATH.to_owned()]),
        cmd: Some(cmd),
        // Only what sandboxd needs; the runner gives each program its own fixed environment.
        env: Some(vec![format!("PATH={}", plimsoll_runner::FIXED_PATH)]),
        user: Some(GUEST_USER.to_owned()),
        working_dir: Some(WORK_DIR.to_owned()),
        hostname: Some("sandbox".to_owned()),
        labels: Some(labels),
        attach_stdin: Some(false),
        attach_stdout: Some(false),
        attach_stderr: Some(false),
        open_stdin: Some(false),
        tty: Some(false),
        stop_timeout: Some(1),
        host_config: Some(HostConfig {
            runtime: Some(s.runtime.to_owned()),
            network_mode: Some("none".to_owned()),
            readonly_rootfs: Some(true),
            privileged: Some(false),
            cap_drop: Some(vec!["ALL".to_owned()]),
            cap_add: Some(vec![]),
            security_opt: Some(security_opt),
            memory: Some(mem),
            memory_swap: Some(mem),
            nano_cpus: Some((s.limits.cpus * 1e9) as i64),
            pids_limit: Some(pids_cgroup_limit(s.runtime, &s.limits)),
            ulimits: Some(vec![
                ResourcesUlimits {
                    name: Some("core".into()),
                    soft: Some(0),
                    hard: Some(0),
                },
                ResourcesUlimits {
                    name: Some("nofile".into()),
                    soft: Some(4096),
                    hard: Some(4096),
                },
            ]),
            ipc_mode: Some("private".to_owned()),
            tmpfs: Some(tmpfs),
            mounts: Some(vec![Mount {
                target: Some(CHANNEL_DIR.to_owned()),
                source: Some(s.host_dir.display().to_string()),
                typ: Some(MountType::BIND),
                read_only: Some(false),
                bind_options: Some(MountBindOptions {
                    propagation: Some(MountBindOptionsPropagationEnum::RPRIVATE),
                    non_recursive: Some(true),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            log_config: Some(HostConfigLogConfig {
                typ: Some("json-file".to_owned()),
                config: Some(HashMap::from([
                    ("max-size".to_owned(), "256k".to_owned()),
                    ("max-file".to_owned(), "1".to_owned()),
                ])),
            }),
            auto_remove: Some(false),
            init: Some(false),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// What a read-back compares of a running container: the lockdown the engine reports it
/// has (image, user, runtime, every `HostConfig` field [`container_body`] sets that the
/// engine can change afterwards, the mounts) and its start (a restarted container has
/// another start time and main pid). Built from `docker inspect` ([`Lockdown::of`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lockdown(Vec<(&'static str, String)>);

impl Lockdown {
    /// The lockdown the engine reports for an inspected container.
    pub fn of(c: &ContainerInspectResponse) -> Lockdown {
        let h = c.host_config.clone().unwrap_or_default();
        let cfg = c.config.clone().unwrap_or_default();
        let state = c.state.clone().unwrap_or_default();
        let mut tmpfs: Vec<String> = h
            .tmpfs
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect();
        tmpfs.sort();
        let mut mounts: Vec<String> = c
            .mounts
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|m| format!("{:?} {:?} rw={:?}", m.source, m.destination, m.rw))
            .collect();
        mounts.sort();
        let d = |v: &dyn std::fmt::Debug| format!("{v:?}");
        Lockdown(vec![
            ("image", d(&c.image)),
            ("user", d(&cfg.user)),
            ("entrypoint", d(&cfg.entrypoint)),
            ("cmd", d(&cfg.cmd)),
            ("runtime", d(&h.runtime)),
            ("network_mode", d(&h.network_mode)),
            ("privileged", d(&h.privileged.unwrap_or(false))),
            ("readonly_rootfs", d(&h.readonly_rootfs)),
            ("cap_add", d(&h.cap_add.unwrap_or_default())),
            ("cap_drop", d(&h.cap_drop)),
            ("security_opt", d(&h.security_opt)),
            ("memory", d(&h.memory)),
            ("memory_swap", d(&h.memory_swap)),
            ("nano_cpus", d(&h.nano_cpus)),
            ("cpu_quota", d(&h.cpu_quota)),
            ("cpu_shares", d(&h.cpu_shares)),
            ("pids_limit", d(&h.pids_limit)),
            ("ipc_mode", d(&h.ipc_mode)),
            ("pid_mode", d(&h.pid_mode)),
            ("devices", d(&h.devices.unwrap_or_default())),
            ("binds", d(&h.binds.unwrap_or_default())),
            ("tmpfs", d(&tmpfs)),
            ("mounts", d(&mounts)),
            ("started_at", d(&state.started_at)),
            ("pid", d(&state.pid)),
        ])
    }

    /// The value the engine reported for `field`.
    pub fn get(&self, field: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| *k == field)
            .map(|(_, v)| v.as_str())
    }

    /// The fields whose values differ from `other`'s.
    pub fn differences(&self, other: &Lockdown) -> Vec<&'static str> {
        self.0
            .iter()
            .zip(&other.0)
            .filter(|(a, b)| a != b)
            .map(|(a, _)| a.0)
            .collect()
    }

    /// What must hold of every sandbox whatever it was opened with: no network, not
    /// privileged, no capability added, a read-only root, no host path but the channel
    /// directory. `Err` names each that does not.
    pub fn check(&self) -> Result<(), String> {
        let want = [
            ("network_mode", "Some(\"none\")"),
            ("privileged", "false"),
            ("cap_add", "[]"),
            ("readonly_rootfs", "Some(true)"),
            ("binds", "[]"),
            ("devices", "[]"),
        ];
        let wrong: Vec<String> = want
            .iter()
            .filter(|(k, v)| self.get(k) != Some(v))
            .map(|(k, _)| format!("{k} is {}", self.get(k).unwrap_or("missing")))
            .collect();
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(wrong.join(", "))
        }
    }
}

/// Pauses every process of the container (the cgroup freezer).
pub async fn pause(docker: &Docker, id: &str) -> Result<(), bollard::errors::Error> {
    docker.pause_container(id).await
}

/// Resumes a paused container.
pub async fn unpause(docker: &Docker, id: &str) -> Result<(), bollard::errors::Error> {
    docker.unpause_container(id).await
}

/// Connects to the engine's Unix socket (not yet contacted).
pub fn connect(socket: &Path) -> Result<Docker, Error> {
    Docker::connect_with_unix(
        &format!("unix://{}", socket.display()),
        API_TIMEOUT_S,
        bollard::API_DEFAULT_VERSION,
    )
    .map_err(|source| Error::Connect {
        socket: socket.to_owned(),
        source,
    })
}

/// Creates and starts the container; on a start failure the created container is removed.
pub async fn create_and_start(docker: &Docker, s: &Spec<'_>) -> Result<String, Error> {
    let created = docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(container_name(s.run_id)),
                platform: String::new(),
            }),
            container_body(s),
        )
        .await
        .map_err(Error::Create)?;
    if let Err(e) = docker.start_container(&created.id, None).await {
        remove(docker, &created.id).await;
        return Err(Error::Start(e));
    }
    Ok(created.id)
}

/// Kills the container (SIGKILL to every process in it). Errors are logged: a container
/// already gone is what was wanted.
pub async fn kill(docker: &Docker, id: &str) {
    if let Err(e) = docker
        .kill_container(
            id,
            Some(KillContainerOptions {
                signal: "KILL".into(),
            }),
        )
        .await
    {
        tracing::debug!(container = %short(id), error = %e, "kill");
    }
}

/// Removes the container, killing it first if it runs. Logged, never fatal.
pub async fn remove(docker: &Docker, id: &str) {
    let opts = RemoveContainerOptions {
        force: true,
        v: true,
        link: false,
    };
    if let Err(e) = docker.remove_container(id, Some(opts)).await {
        if !is_not_found(&e) {
            tracing::warn!(container = %short(id), error = %e, "could not remove a sandbox container");
        }
    }
}

/// Whether an engine error says the object does not exist.
pub fn is_not_found(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

/// IDs of every container (running or not) whose label `key` equals `value`.
pub async fn containers_labelled(
    docker: &Docker,
    key: &str,
    value: &str,
) -> Result<Vec<String>, bollard::errors::Error> {
    let filters = HashMap::from([("label".to_owned(), vec![format!("{key}={value}")])]);
    let list = docker
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        }))
        .await?;
    Ok(list.into_iter().filter_map(|c| c.id).collect())
}

/// The last lines the container wrote (sandboxd's own log), for a startup error message.
pub async fn log_tail(docker: &Docker, id: &str) -> String {
    let mut stream = docker.logs(
        id,
        Some(LogsOptions {
            stdout: true,
            stderr: true,
            tail: "20".into(),
            ..Default::default()
        }),
    );
    let mut out = String::new();
    while let Some(Ok(chunk)) = stream.next().await {
        out.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
        if out.len() > 8192 {
            break;
        }
    }
    out.trim().to_owned()
}

/// The first 12 hex digits of an ID, for logs.
pub fn short(id: &str) -> &str {
    let id = id.strip_prefix("sha256:").unwrap_or(id);
    &id[..id.len().min(12)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(dir: &Path) -> Spec<'_> {
        Spec {
            image_id: "sha256:abc",
            runtime: "runc",
            limits: Limits {
                memory_mb: 256,
                cpus: 0.5,
                pids: 64,
                tmp_mb: 16,
                shm_mb: 16,
                work_mb: 100,
            },
            seccomp_json: None,
            instance: "inst",
            run_id: "run1",
            host_dir: dir,
            default_timeout_ms: 30_000,
            output_bytes: 1000,
            languages: None,
            session: false,
        }
    }

    #[test]
    fn the_container_is_locked_down() {
        let dir = Path::new("/state/docker/run1");
        let b = container_body(&spec(dir));
        let h = b.host_config.as_ref().unwrap();
        assert_eq!(b.image.as_deref(), Some("sha256:abc"));
        assert_eq!(b.user.as_deref(), Some(GUEST_USER));
        assert_eq!(h.network_mode.as_deref(), Some("none"));
        assert_eq!(h.readonly_rootfs, Some(true));
        assert_eq!(h.privileged, Some(false));
        assert_eq!(h.cap_drop.as_deref(), Some(&["ALL".to_owned()][..]));
        assert!(h.cap_add.as_ref().unwrap().is_empty());
        assert!(h
            .security_opt
            .as_ref()
            .unwrap()
            .contains(&"no-new-privileges:true".to_owned()));
        assert!(!h
            .security_opt
            .as_ref()
            .unwrap()
            .iter()
            .any(|o| o.contains("unconfined")));
        assert_eq!(h.memory, Some(256 * 1024 * 1024));
        assert_eq!(h.memory_swap, h.memory);
        assert_eq!(h.pids_limit, Some(64));
        assert_eq!(h.nano_cpus, Some(500_000_000));
        let tmpfs = h.tmpfs.as_ref().unwrap();
        assert_eq!(tmpfs.len(), 3);
        for (path, opts) in tmpfs {
            assert!(
                opts.contains("noexec") && opts.contains("nosuid"),
                "{path}: {opts}"
            );
            assert!(opts.contains("size="), "{path}: {opts}");
        }
        assert!(tmpfs["/work"].contains("size=100m"));
        // The only host mount is the per-run channel directory.
        let mounts = h.mounts.as_ref().unwrap();
        assert_eq!(mounts.len(), 1);
        assert_eq!(mounts[0].source.as_deref(), Some("/state/docker/run1"));
        assert_eq!(mounts[0].target.as_deref(), Some(CHANNEL_DIR));
        assert!(h.binds.is_none());
        assert_eq!(
            b.entrypoint.as_deref(),
            Some(&[SANDBOXD_PATH.to_owned()][..])
        );
        let labels = b.labels.as_ref().unwrap();
        assert_eq!(labels[LABEL_INSTANCE], "inst");
        assert_eq!(labels[LABEL_RUN], "run1");
    }

    #[test]
    fn a_given_seccomp_profile_is_passed_inline() {
        let dir = Path::new("/d");
        let mut s = spec(dir);
        s.seccomp_json = Some("{\"defaultAction\":\"SCMP_ACT_ERRNO\"}");
        s.runtime = "runsc";
        let b = container_body(&s);
        let h = b.host_config.unwrap();
        assert!(h
            .security_opt
            .unwrap()
            .iter()
            .any(|o| o.starts_with("seccomp={")));
        assert_eq!(h.runtime.as_deref(), Some("runsc"));
    }

    #[test]
    fn under_runsc_the_process_limit_is_kept_inside_gvisor() {
        let dir = Path::new("/d");
        let mut s = spec(dir);
        let b = container_body(&s);
        assert_eq!(b.host_config.unwrap().pids_limit, Some(64));
        assert!(!b.cmd.unwrap().iter().any(|a| a == "--max-processes"));
        s.runtime = "runsc";
        let b = container_body(&s);
        let cmd = b.cmd.unwrap();
        let flag = |f: &str| {
            let at = cmd.iter().position(|a| a == f).expect("the flag");
            cmd[at + 1].clone()
        };
        let l = &s.limits;
        // The smaller of SANDBOX_PIDS and one per 6 MiB of memory; 3/4 of it per process.
        let want = l.pids.min(l.memory_mb / 6).max(16);
        assert_eq!(flag("--max-processes"), want.to_string());
        assert_eq!(
            flag("--max-memory-mb"),
            (l.memory_mb / 4 * 3).max(384).to_string()
        );
        assert_eq!(
            b.host_config.unwrap().pids_limit,
            Some(64 + 16 * i64::from(want))
        );
        let default = Limits {
            pids: 256,
            memory_mb: 512,
            ..*l
        };
        assert_eq!(gvisor_bounds(&default), (85, 384));
    }

    #[test]
    fn proven_languages_are_handed_to_sandboxd_only_after_the_smoke_test() {
        let dir = Path::new("/d");
        let mut s = spec(dir);
        let cmd = container_body(&s).cmd.unwrap();
        assert!(!cmd.iter().any(|a| a == "--languages"), "{cmd:?}");
        let proven = vec!["javascript".to_owned(), "shell".to_owned()];
        s.languages = Some(&proven);
        let cmd = container_body(&s).cmd.unwrap();
        let i = cmd.iter().position(|a| a == "--languages").unwrap();
        assert_eq!(cmd[i + 1], "javascript,shell");
        s.languages = Some(&[]);
        let cmd = container_body(&s).cmd.unwrap();
        assert_eq!(cmd.last().map(String::as_str), Some("none"));
    }

    #[test]
    fn a_session_container_runs_sandboxd_in_session_mode_and_is_labelled() {
        let dir = Path::new("/d");
        let mut s = spec(dir);
        let b = container_body(&s);
        assert!(!b.cmd.unwrap().iter().any(|a| a == "--session"));
        assert!(!b.labels.unwrap().contains_key(LABEL_SESSION));
        s.session = true;
        let b = container_body(&s);
        assert!(b.cmd.unwrap().iter().any(|a| a == "--session"));
        let labels = b.labels.unwrap();
        assert_eq!(labels[LABEL_SESSION], "1");
        assert_eq!(labels[LABEL_INSTANCE], "inst");
    }

    #[test]
    fn the_read_back_names_what_changed_and_what_must_always_hold() {
        let b = container_body(&spec(Path::new("/d")));
        let inspected = |memory: i64, cap_add: Vec<String>| ContainerInspectResponse {
            image: b.image.clone(),
            host_config: Some(HostConfig {
                memory: Some(memory),
                cap_add: Some(cap_add),
                ..b.host_config.clone().unwrap()
            }),
            ..Default::default()
        };
        let opened = Lockdown::of(&inspected(1 << 28, vec![]));
        assert_eq!(opened.check(), Ok(()));
        assert!(opened.differences(&opened).is_empty());
        let more = Lockdown::of(&inspected(1 << 30, vec![]));
        assert_eq!(more.differences(&opened), ["memory"]);
        let cap = Lockdown::of(&inspected(1 << 28, vec!["SYS_ADMIN".into()]));
        assert!(cap.check().unwrap_err().contains("cap_add"));
    }
}
