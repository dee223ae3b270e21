//! plimsoll-sandboxd: the runner inside a sandbox (container or pod), served as the
//! token-authenticated gRPC service `plimsoll.sandboxd.v1.Sandboxd`, one payload at a time.
//!
//! This file only parses flags, builds the configuration and maps errors to exit codes; the
//! service lives in the `plimsoll-sandboxd` library. It must never start without a token
//! unless `--insecure-no-token` says so, and never log a token.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use plimsoll_runner::{Limits, RunAs, Runner, RunnerConfig};
use plimsoll_sandboxd::{Auth, SandboxdService, TokenFile};

const AFTER_HELP: &str = "\
Exit codes:
  0  stopped by SIGTERM or SIGINT
  1  could not serve (for example the address is in use)
  2  usage or configuration error (the message names the flag)

--session keeps one working directory for every call (a session: one caller's sandbox,
never shared); its directory goes when sandboxd stops (in a container: with the container).

Every call on TCP or --unix-socket must carry `authorization: Bearer <token>` with a token
from --token-file (one token per line; two lines during a rotation; the file is re-read
every 2 s). Calls without it are refused, marked not dispatched (permission), before the
payload is read. The one exception is --terminator-socket, below.

--terminator-socket=PATH (added by plimsoll-sandboxd-tls when it requires client
certificates; needs --run-as): sandboxd also serves on that Unix socket, in a directory
that must be its own user's with no access for anyone else, and takes calls there without
a token, only from connections whose peer runs as sandboxd's own user (the terminator);
the terminator forwards there only connections whose client certificate it verified. With
it, --token-file is optional; without a token file every call on TCP is refused.

PLIMSOLL_SANDBOXD_PARENT_PID=<pid> (set by plimsoll-sandboxd-tls): sandboxd asks the kernel
for SIGKILL when its parent dies, and exits at once (code 1) if its parent is not that
process any more, so it never outlives the terminator that started it.";

/// The runner inside a sandbox, behind a token-authenticated gRPC service.
#[derive(Debug, Parser)]
#[command(name = "plimsoll-sandboxd", version, after_help = AFTER_HELP)]
struct Flags {
    /// Address to listen on (behind plimsoll-sandboxd-tls it must be 127.0.0.1).
    #[arg(long, default_value = "127.0.0.1", value_name = "IP")]
    listen_host: IpAddr,
    /// TCP port to listen on.
    #[arg(long, default_value_t = 9091, value_name = "PORT")]
    grpc_port: u16,
    /// Serve on this Unix socket instead of TCP (the Docker provider's per-run directory).
    #[arg(long, value_name = "PATH", conflicts_with_all = ["listen_host", "grpc_port"])]
    unix_socket: Option<PathBuf>,
    /// Runs get fresh working directories under this directory [default: $TMPDIR/plimsoll-sandboxd].
    #[arg(long, value_name = "DIR")]
    root_dir: Option<PathBuf>,
    /// File holding the sandboxd token (one per line, at most two).
    #[arg(long, value_name = "PATH")]
    token_file: Option<PathBuf>,
    /// Accept calls without a token. For tests only.
    #[arg(long, conflicts_with = "token_file")]
    insecure_no_token: bool,
    /// Also serve on this Unix socket, for the TLS terminator only, taking calls without a
    /// token: the terminator (plimsoll-sandboxd-tls with PLIMSOLL_SANDBOXD_CLIENT_CA) adds
    /// it and forwards there only connections whose client certificate it verified. The
    /// socket's directory must be sandboxd's own with no access for group or others. With
    /// it, --token-file is optional: without one, calls on TCP are all refused.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["unix_socket", "insecure_no_token"])]
    terminator_socket: Option<PathBuf>,
    /// Deadline for a payload whose request leaves it to sandboxd, in milliseconds.
    #[arg(long, default_value_t = 30_000, value_name = "MS")]
    default_timeout_ms: u64,
    /// Bytes kept of each output stream (stdout, stderr) per program; the rest is dropped
    /// and marked truncated.
    #[arg(long, default_value_t = 1024 * 1024, value_name = "BYTES")]
    output_bytes: usize,
    /// After SIGTERM, how long calls in flight may take before sandboxd exits, in milliseconds.
    #[arg(long, default_value_t = 10_000, value_name = "MS")]
    shutdown_grace_ms: u64,
    /// Languages to report without proving them at startup, comma-separated
    /// (`javascript,python,shell`, or `none`), for a caller that proved them on this same
    /// image (the Docker provider's smoke test); unset proves them, which costs a node and a
    /// python3 start before sandboxd listens.
    #[arg(long, value_name = "LIST", value_parser = parse_languages)]
    languages: Option<Languages>,
    /// Run every program as this user and group (`UID:GID`, neither 0) instead of
    /// sandboxd's own, so the code cannot read sandboxd's token, the pod's TLS key or the
    /// memory of sandboxd and the terminator. sandboxd must be root (in a pod: uid 0 with
    /// only CHOWN, DAC_OVERRIDE, FOWNER, KILL, SETUID and SETGID). The token file must not be
    /// readable by that user or group. Every process of that user is killed at the end of
    /// each run, so give sandboxd a user no one else uses.
    #[arg(long, value_name = "UID:GID", value_parser = parse_run_as)]
    run_as: Option<RunAs>,
    /// Session mode: open one session at startup and run every payload in it (one at a
    /// time), so files persist across calls; every process a call leaves is killed after
    /// it, except the kept interpreters of cells. Each answer states the session's disk
    /// bytes and whether that sweep proved the call left nothing. Without it every payload
    /// gets a fresh directory and cells are refused.
    #[arg(long)]
    session: bool,
    /// At most this many processes and threads (sandboxd's own included) for sandboxd's
    /// user, set as the kernel's per-user process limit (`RLIMIT_NPROC`) before anything
    /// starts; inherited by every program. In a user namespace of its own (the bwrap
    /// provider's sandboxes) it counts that sandbox's processes only. With it, sandboxd
    /// keeps to 2 worker threads and 8 blocking threads.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(16..))]
    max_processes: Option<u32>,
    /// At most this many MiB of address space and of data (`RLIMIT_AS` and `RLIMIT_DATA`)
    /// per process, sandboxd's own included, set before anything starts and inherited by
    /// every program: an allocation beyond it fails (Python's `MemoryError`, node's
    /// allocation failure). A bound per process, not in total: the bwrap provider uses it
    /// where no delegated cgroup v2 holds a sandbox's memory.
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u32).range(32..))]
    max_memory_mb: Option<u32>,
    /// Restrict sandboxd and every program it starts with Landlock (where the kernel offers
    /// it), for the bwrap provider's sandbox layout: read and execute only the system
    /// directories (`/usr`, `/etc`, `/bin`, `/sbin`, `/lib*`), read `/proc`, write but never
    /// execute in --root-dir, `/tmp` and `/dev`, and only create the --unix-socket in its
    /// directory. The log states what the kernel enforced.
    #[arg(long)]
    landlock: bool,
    /// Connections open at once on each listener (lowered to fit RLIMIT_NOFILE); more wait
    /// in the listen backlog until one closes.
    #[arg(long, default_value_t = 64, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    /// Close a connection whose first request has not come within this many milliseconds
    /// (0: never) [default: 10000 on TCP and --terminator-socket, never on --unix-socket,
    /// where plimsolld connects when the sandbox starts and may call much later].
    #[arg(long, value_name = "MS")]
    header_timeout_ms: Option<u64>,
    /// Close a connection with no call in flight for this many milliseconds; pings do not
    /// count (0: never) [default: 600000 on TCP and --terminator-socket, never on
    /// --unix-socket, where plimsolld keeps one connection for a whole session].
    #[arg(long, value_name = "MS")]
    idle_timeout_ms: Option<u64>,
    /// Log format: `text` or `json` [default: text on a terminal, json otherwise].
    #[arg(long, value_name = "FORMAT", value_enum)]
    log_format: Option<plimsoll_log::LogFormat>,
}

impl Flags {
    /// A listener's limits: `defaults` with the flags that were given.
    fn limits(&self, defaults: plimsoll_sandboxd::Limits) -> plimsoll_sandboxd::Limits {
        let ms = |v: Option<u64>, d: Duration| match v {
            None => d,
            Some(0) => plimsoll_sandboxd::NEVER,
            Some(ms) => Duration::from_millis(ms),
        };
        plimsoll_sandboxd::Limits {
            max_connections: self.max_connections as usize,
            header_timeout: ms(self.header_timeout_ms, defaults.header_timeout),
            idle_timeout: ms(self.idle_timeout_ms, defaults.idle_timeout),
        }
    }
}

/// The languages sandboxd can run; `--languages` accepts only these.
const KNOWN_LANGUAGES: [&str; 3] = ["javascript", "python", "shell"];

/// The value of `--languages` (a newtype, so clap takes one value, not a list of values).
#[derive(Debug, Clone)]
struct Languages(Vec<String>);

fn parse_languages(v: &str) -> Result<Languages, String> {
    if v.trim() == "none" {
        return Ok(Languages(Vec::new()));
    }
    let mut out = Vec::new();
    for l in v.split(',').map(str::trim) {
        if !KNOWN_LANGUAGES.contains(&l) {
            return Err(format!(
                "{l:?} is not a language sandboxd runs; use a comma-separated subset of {} or `none`",
                KNOWN_LANGUAGES.join(",")
            ));
        }
        if !out.iter().any(|o| o == l) {
            out.push(l.to_owned());
        }
    }
    Ok(Languages(out))
}

fn parse_run_as(v: &str) -> Result<RunAs, String> {
    let (u, g) = v
        .split_once(':')
        .ok_or_else(|| format!("{v:?}: give UID:GID, for example 65532:65532"))?;
    let uid: u32 = u
        .parse()
        .map_err(|_| format!("{u:?} is not a numeric user id"))?;
    let gid: u32 = g
        .parse()
        .map_err(|_| format!("{g:?} is not a numeric group id"))?;
    if uid == 0 || gid == 0 {
        return Err("the code must not run as uid or gid 0".to_owned());
    }
    Ok(RunAs { uid, gid })
}

/// Refuses a secret file that the run's user could read: owned by it, readable by its
/// group, or readable by anyone.
fn check_unreadable_by(path: &std::path::Path, who: RunAs) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mode = m.mode() & 0o777;
    let why = if m.uid() == who.uid {
        Some(format!("it is owned by the run's user {}", who.uid))
    } else if mode & 0o004 != 0 {
        Some(format!("its mode {mode:04o} lets every user read it"))
    } else if m.gid() == who.gid && mode & 0o040 != 0 {
        Some(format!(
            "its mode {mode:04o} lets group {} (the run's group) read it",
            who.gid
        ))
    } else {
        None
    };
    match why {
        Some(why) => Err(format!(
            "{} would be readable by the code ({why}); make it owned by sandboxd's user with mode 0400 (no fsGroup on the pod)",
            path.display()
        )),
        None => Ok(()),
    }
}

fn usage_error(flag: &str, msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("plimsoll-sandboxd: {flag}: {msg}");
    ExitCode::from(2)
}

/// The variable through which a supervisor (plimsoll-sandboxd-tls) names itself, so sandboxd
/// dies with it even when the supervisor is killed with SIGKILL.
const PARENT_PID_VAR: &str = "PLIMSOLL_SANDBOXD_PARENT_PID";

/// Ties sandboxd's life to the supervisor named by [`PARENT_PID_VAR`]: the kernel sends
/// SIGKILL when the parent exits, and a parent that already died before the request was made
/// (sandboxd then has another parent) ends sandboxd here. Unset: nothing is done (the Docker
/// provider starts sandboxd as a container's entrypoint, where the container is the bound).
fn die_with_parent() -> Result<(), String> {
    let Ok(v) = std::env::var(PARENT_PID_VAR) else {
        return Ok(());
    };
    let want: i32 = v
        .trim()
        .parse()
        .map_err(|_| format!("{PARENT_PID_VAR}={v:?} is not a process id"))?;
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| format!("cannot ask for the parent-death signal: {e}"))?;
    // Checked after the request: a parent that died between fork and here left us
    // re-parented, and the signal will never come.
    let parent = nix::unistd::getppid().as_raw();
    if parent != want {
        return Err(format!(
            "the supervisor (pid {want}) is gone (parent is now pid {parent}); not starting"
        ));
    }
    Ok(())
}

fn main() -> ExitCode {
    // Before any thread: no descriptor this process inherited reaches a run (docs/plimsolld.md).
    plimsoll_log::fds::at_start("plimsoll-sandboxd");
    let flags = Flags::parse();
    if let Err(e) = die_with_parent() {
        eprintln!("plimsoll-sandboxd: {e}");
        return ExitCode::from(1);
    }
    plimsoll_log::init(flags.log_format);
    // The code of a run may share sandboxd's user (the bwrap provider's sandboxes, a container
    // without --run-as): it must not read sandboxd's memory (the token) or environment
    // through /proc. Programs sandboxd starts are dumpable again after their exec.
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        eprintln!("plimsoll-sandboxd: cannot make itself non-dumpable: {e}");
        return ExitCode::from(1);
    }

    let auth = match (&flags.token_file, flags.insecure_no_token) {
        (Some(path), false) => match TokenFile::open(path) {
            Ok(f) => Auth::Tokens(f),
            Err(e) => return usage_error("--token-file", e),
        },
        (None, true) => {
            tracing::warn!("serving WITHOUT a token (--insecure-no-token): tests only");
            Auth::InsecureNoToken
        }
        (None, false) if flags.terminator_socket.is_some() => {
            tracing::info!("no token file: calls are taken only through the terminator's socket");
            Auth::Closed
        }
        _ => {
            return usage_error(
                "--token-file",
                "required: sandboxd refuses to start without a token (--insecure-no-token is for tests only)",
            )
        }
    };
    if let Some(path) = &flags.terminator_socket {
        if let Err(e) = check_private_dir(path) {
            return usage_error("--terminator-socket", e);
        }
        if flags.run_as.is_none() {
            return usage_error(
                "--terminator-socket",
                "needs --run-as: without a user of its own the code runs as sandboxd's user, which is the one user the socket lets call without a token",
            );
        }
    }
    let root_dir = flags
        .root_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("plimsoll-sandboxd"));
    if flags.default_timeout_ms == 0 {
        return usage_error("--default-timeout-ms", "must be positive");
    }
    if let Some(who) = flags.run_as {
        if !nix::unistd::geteuid().is_root() {
            return usage_error(
                "--run-as",
                "sandboxd must run as root to start programs as another user",
            );
        }
        if let Some(path) = &flags.token_file {
            if let Err(e) = check_unreadable_by(path, who) {
                return usage_error("--token-file", e);
            }
        }
        // Nothing sandboxd starts may gain privileges through exec (set-user-id files,
        // file capabilities); inherited by every program.
        if let Err(e) = nix::sys::prctl::set_no_new_privs() {
            eprintln!("plimsoll-sandboxd: cannot set no_new_privs: {e}");
            return ExitCode::from(1);
        }
    }
    let runner = match Runner::new(RunnerConfig {
        root_dir: root_dir.clone(),
        limits: Limits {
            output_bytes: flags.output_bytes,
            ..Limits::default()
        },
        default_timeout: Duration::from_millis(flags.default_timeout_ms),
    }) {
        Ok(r) => r,
        Err(e) => return usage_error("--root-dir", format!("{}: {e}", root_dir.display())),
    };
    let runner = match flags.run_as {
        Some(who) => match runner.run_as(who) {
            Ok(r) => {
                tracing::info!(uid = who.uid, gid = who.gid, "programs run as another user");
                Arc::new(r)
            }
            Err(e) => return usage_error("--run-as", e),
        },
        None => Arc::new(runner),
    };

    if flags.landlock {
        // Before the runtime's threads exist: Landlock binds the calling thread and its
        // future children only.
        let socket_dir = flags
            .unix_socket
            .as_deref()
            .and_then(std::path::Path::parent);
        match plimsoll_sandboxd::landlock::restrict(&root_dir, socket_dir) {
            Ok(status) => tracing::info!(?status, "landlock rules applied"),
            Err(e) => {
                eprintln!("plimsoll-sandboxd: --landlock: {e}");
                return ExitCode::from(1);
            }
        }
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(mb) = flags.max_memory_mb {
        use nix::sys::resource::{setrlimit, Resource};
        let bytes = u64::from(mb) << 20;
        for (name, r) in [
            ("RLIMIT_AS", Resource::RLIMIT_AS),
            ("RLIMIT_DATA", Resource::RLIMIT_DATA),
        ] {
            if let Err(e) = setrlimit(r, bytes, bytes) {
                eprintln!("plimsoll-sandboxd: cannot set {name} to {mb} MiB: {e}");
                return ExitCode::from(1);
            }
        }
        tracing::info!(
            mib = mb,
            "memory per process bounded (RLIMIT_AS, RLIMIT_DATA)"
        );
    }
    if let Some(n) = flags.max_processes {
        let limit = u64::from(n);
        if let Err(e) =
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NPROC, limit, limit)
        {
            eprintln!("plimsoll-sandboxd: cannot set the process limit to {n}: {e}");
            return ExitCode::from(1);
        }
        builder.worker_threads(2).max_blocking_threads(8);
    }
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("plimsoll-sandboxd: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    rt.block_on(serve(flags, runner, auth))
}

async fn serve(flags: Flags, runner: Arc<Runner>, auth: Auth) -> ExitCode {
    // Signal handlers first: a SIGTERM that arrives right after "listening" must not kill
    // the process with the default action.
    use tokio::signal::unix::{signal, SignalKind};
    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(t), Ok(i)) => (t, i),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("plimsoll-sandboxd: cannot handle signals: {e}");
            return ExitCode::from(1);
        }
    };
    if let Auth::Tokens(f) = &auth {
        f.spawn_refresh(Duration::from_secs(2));
    }
    let service = match flags.languages.clone() {
        Some(Languages(given)) => {
            tracing::info!("languages given by the caller: [{}]", given.join(", "));
            SandboxdService::with_languages(runner, given)
        }
        None => {
            let s = SandboxdService::new(runner).await;
            tracing::info!("languages proven: [{}]", s.languages().join(", "));
            s
        }
    };
    let service = if flags.session {
        match service.into_session() {
            Ok(s) => {
                tracing::info!("session mode: every payload runs in one session");
                s
            }
            Err(e) => {
                eprintln!("plimsoll-sandboxd: --session: cannot open the session: {e}");
                return ExitCode::from(1);
            }
        }
    } else {
        service
    };
    let (route, terminator_route) = match &flags.terminator_socket {
        Some(_) => {
            let (tcp, socket) = service.into_servers(auth, Auth::Terminator);
            (tcp, Some(socket))
        }
        None => (service.into_server(auth), None),
    };
    let grace = Duration::from_millis(flags.shutdown_grace_ms);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let shutdown = {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };

    // The terminator's socket is bound before the TCP listener, so a terminator that sees
    // TCP accept can rely on the socket too.
    let terminator_server = match (&flags.terminator_socket, terminator_route) {
        (Some(path), Some(route)) => {
            let listener = match bind_private_socket(path) {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("plimsoll-sandboxd: --terminator-socket: {e}");
                    return ExitCode::from(1);
                }
            };
            tracing::info!("listening on unix:{} for the terminator", path.display());
            let mut rx = stop_rx.clone();
            Some(tokio::spawn(plimsoll_sandboxd::serve_unix_for_uid(
                listener,
                nix::unistd::geteuid().as_raw(),
                route,
                flags.limits(plimsoll_sandboxd::DEFAULT_LIMITS),
                async move {
                    let _ = rx.wait_for(|s| *s).await;
                },
            )))
        }
        _ => None,
    };

    let server = async {
        match &flags.unix_socket {
            Some(path) => {
                if let Ok(meta) = std::fs::symlink_metadata(path) {
                    use std::os::unix::fs::FileTypeExt;
                    if !meta.file_type().is_socket() {
                        return Err(usage_error(
                            "--unix-socket",
                            format!("{} exists and is not a socket", path.display()),
                        ));
                    }
                    let _ = std::fs::remove_file(path);
                }
                let listener = tokio::net::UnixListener::bind(path).map_err(|e| {
                    eprintln!(
                        "plimsoll-sandboxd: cannot listen on unix:{}: {e}",
                        path.display()
                    );
                    ExitCode::from(1)
                })?;
                // Who may connect is decided by the directory holding the socket and by the
                // token; the socket itself is open to any uid that can reach it (plimsolld
                // need not run as the container's user).
                if let Err(e) = std::fs::set_permissions(
                    path,
                    std::os::unix::fs::PermissionsExt::from_mode(0o666),
                ) {
                    tracing::warn!("cannot open unix:{} to other users: {e}", path.display());
                }
                tracing::info!("listening on unix:{}", path.display());
                plimsoll_sandboxd::serve_unix(
                    listener,
                    route,
                    flags.limits(plimsoll_sandboxd::UNIX_SOCKET_LIMITS),
                    shutdown,
                )
                .await
            }
            None => {
                let addr = SocketAddr::new(flags.listen_host, flags.grpc_port);
                let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
                    eprintln!("plimsoll-sandboxd: cannot listen on {addr}: {e}");
                    ExitCode::from(1)
                })?;
                let bound = listener.local_addr().unwrap_or(addr);
                tracing::info!("listening on {bound}");
                plimsoll_sandboxd::serve_tcp(
                    listener,
                    route,
                    flags.limits(plimsoll_sandboxd::DEFAULT_LIMITS),
                    shutdown,
                )
                .await
            }
        }
        .map_err(|e| {
            eprintln!("plimsoll-sandboxd: serving failed: {e}");
            ExitCode::from(1)
        })
    };
    tokio::pin!(server);

    let signal = async {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    };
    let outcome = tokio::select! {
        r = &mut server => r,
        name = signal => {
            tracing::info!("{name}: no new calls; letting calls in flight finish for up to {grace:?}");
            let _ = stop_tx.send(true);
            match tokio::time::timeout(grace, &mut server).await {
                Ok(r) => r,
                Err(_) => {
                    tracing::warn!("calls still in flight after {grace:?}; exiting anyway");
                    Ok(())
                }
            }
        }
    };
    if let Some(t) = terminator_server {
        t.abort();
    }
    if let Some(path) = &flags.terminator_socket {
        let _ = std::fs::remove_file(path);
    }
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(code) => code,
    }
}

/// The terminator socket's directory must exist, belong to sandboxd's own user and give
/// group and others no access at all: that, not a token, is what keeps the code out.
fn check_private_dir(socket: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let dir = socket
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .ok_or_else(|| {
            format!(
                "{}: give a path inside a private directory",
                socket.display()
            )
        })?;
    let m = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !m.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    let me = nix::unistd::geteuid().as_raw();
    if m.uid() != me {
        return Err(format!(
            "{} belongs to uid {}, not sandboxd's uid {me}",
            dir.display(),
            m.uid()
        ));
    }
    if m.mode() & 0o077 != 0 {
        return Err(format!(
            "{} has mode {:o}; it must give group and others no access (0700)",
            dir.display(),
            m.mode() & 0o7777
        ));
    }
    Ok(())
}

/// Binds the terminator's socket (replacing a stale socket, never another kind of file),
/// readable and writable by sandboxd's own user only.
fn bind_private_socket(path: &Path) -> Result<tokio::net::UnixListener, String> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(format!("{} exists and is not a socket", path.display()));
        }
        let _ = std::fs::remove_file(path);
    }
    let l = tokio::net::UnixListener::bind(path)
        .map_err(|e| format!("cannot listen on unix:{}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(l)
}
