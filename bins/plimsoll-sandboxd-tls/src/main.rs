//! plimsoll-sandboxd-tls: the pod's command. It checks sandboxd's flags, starts sandboxd on
//! 127.0.0.1:9091, waits until it accepts, then serves TLS 1.3 (ALPN `h2`) on :9090 and
//! copies bytes both ways; it exits when sandboxd exits, with sandboxd's status.
//!
//! This file parses arguments and environment and maps outcomes to exit codes; the work is
//! in `plimsoll_tls::{terminator, supervise}`. It must never start sandboxd on an address
//! other than loopback, never forward a byte before a TLS 1.3 handshake with `h2`, and never
//! log key material.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use plimsoll_config::ProcessEnv;
use plimsoll_tls::supervise::{
    check_sandboxd_flags, flags_for_upstream, private_socket_dir, NotReady, Sandboxd,
    TERMINATOR_SOCKET_FLAG,
};
use plimsoll_tls::terminator::{env, TerminatorConfig, VARIABLES};
use plimsoll_tls::{CertDir, Terminator};

const DEFAULT_SANDBOXD: &str = "/usr/local/bin/plimsoll-sandboxd";

/// How long sandboxd gets to stop after the drain before SIGKILL.
const SANDBOXD_STOP_GRACE: Duration = Duration::from_secs(10);

const USAGE: &str = "\
plimsoll-sandboxd-tls: the pod-side TLS 1.3 terminator in front of plimsoll-sandboxd

Usage: plimsoll-sandboxd-tls SANDBOXD-FLAGS...
       plimsoll-sandboxd-tls --help | --version

Every argument is passed to sandboxd. They must include --listen-host=127.0.0.1 and
--grpc-port=9091 (exactly so, once each), and not --unix-socket. The terminator starts
sandboxd, waits until it accepts on 127.0.0.1:9091, then serves TLS 1.3 with ALPN h2 on
:9090 using tls.crt and tls.key from /etc/plimsoll/sandboxd-tls, and forwards each
connection to sandboxd. A rotated Secret (or a certificate renewed by cert-manager's CSI
driver, which writes the same file names) is picked up without a restart; open connections
keep going. With PLIMSOLL_SANDBOXD_CLIENT_CA set, every client must present a certificate
chaining to a CA in that file (mutual TLS) before a byte is forwarded, and verified
connections go to a socket of sandboxd's in a directory only the terminator's user can
enter (sandboxd is given --terminator-socket), where calls need no sandboxd token; the
token on 127.0.0.1:9091 stays as it is. `--log-format json|text` is read from sandboxd's
flags too.

";

const EXIT_CODES: &str = "\
Exit codes:
  0        stopped by SIGTERM/SIGINT, drained, sandboxd stopped
  1        could not serve (bind failed, sandboxd never accepted, drain cut connections)
  2        usage or configuration error (the message names the flag, variable or file)
  other    sandboxd exited: its exit code, or 128 + the signal that ended it
";

fn fail(code: u8, msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("plimsoll-sandboxd-tls: {msg}");
    ExitCode::from(code)
}

/// The `--log-format` among sandboxd's flags, which the terminator's own log follows too
/// (an unknown value is left to sandboxd to refuse; the terminator then picks by terminal).
fn log_format(args: &[String]) -> Option<plimsoll_log::LogFormat> {
    let value = args.iter().enumerate().find_map(|(i, a)| {
        a.strip_prefix("--log-format=").or_else(|| {
            (a == "--log-format")
                .then(|| args.get(i + 1).map(String::as_str))
                .flatten()
        })
    })?;
    match value {
        "json" => Some(plimsoll_log::LogFormat::Json),
        "text" => Some(plimsoll_log::LogFormat::Text),
        _ => None,
    }
}

fn main() -> ExitCode {
    // Before any thread: no descriptor this process inherited reaches a run (docs/plimsolld.md).
    plimsoll_log::fds::at_start("plimsoll-sandboxd-tls");
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [a] if a == "--help" || a == "-h" => {
            print!(
                "{USAGE}Environment (all optional):\n{}\n{EXIT_CODES}",
                plimsoll_config::help(&[VARIABLES])
            );
            return ExitCode::SUCCESS;
        }
        [a] if a == "--version" || a == "-V" => {
            println!("plimsoll-sandboxd-tls {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        _ => {}
    }
    if let Err(e) = check_sandboxd_flags(&args) {
        return fail(2, e);
    }
    plimsoll_log::init(log_format(&args));
    let cfg = match TerminatorConfig::from_env(&ProcessEnv) {
        Ok(c) => c,
        Err(e) => return fail(2, e),
    };
    for k in
        plimsoll_config::unknown_variables(&ProcessEnv, &["PLIMSOLL_SANDBOXD_TLS_"], &[VARIABLES])
    {
        tracing::warn!("unknown variable {k} ignored (see --help for the variables read)");
    }
    let bin = std::env::var_os(env::SANDBOXD_BIN)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SANDBOXD));
    // The pair and the client CA are checked before sandboxd starts: a broken Secret or CA
    // file is a configuration error.
    if let Err(e) = CertDir::open(&cfg.cert_dir) {
        return fail(2, format!("{}: {e}", env::DIR));
    }
    if let Some(ca) = &cfg.client_ca {
        if let Err(e) = plimsoll_tls::ClientCaFile::open(ca) {
            return fail(2, format!("{}: {e}", plimsoll_tls::CLIENT_CA_VAR));
        }
        if let Err(e) = plimsoll_tls::supervise::check_run_as_for_client_ca(&args) {
            return fail(2, e);
        }
    }
    // One thread: a byte pump gains nothing from a second worker on a pod's small CPU share,
    // and cross-thread wake-ups add latency to every round trip (`cargo xtask bench
    // sandboxd-tls` measures it).
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(1, format!("cannot start the async runtime: {e}")),
    };
    rt.block_on(run(cfg, bin, args))
}

async fn stop_during_startup(sandboxd: &Sandboxd, name: &str) -> ExitCode {
    tracing::info!("{name} during startup: stopping sandboxd");
    let e = sandboxd.stop(SANDBOXD_STOP_GRACE).await;
    tracing::info!("stopped: sandboxd ended ({e})");
    ExitCode::SUCCESS
}

async fn run(mut cfg: TerminatorConfig, bin: PathBuf, args: Vec<String>) -> ExitCode {
    // Signal handlers before anything starts: a SIGTERM at any moment from here on is a
    // graceful stop, never the default action.
    use tokio::signal::unix::{signal, SignalKind};
    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(t), Ok(i)) => (t, i),
        (Err(e), _) | (_, Err(e)) => return fail(1, format!("cannot handle signals: {e}")),
    };
    let mut sandboxd_args = flags_for_upstream(&args, cfg.upstream);
    // Mutual TLS: verified connections reach sandboxd through a socket in a directory of
    // the terminator's own, where calls need no token.
    if cfg.client_ca.is_some() {
        match private_socket_dir(&std::env::temp_dir()) {
            Ok(sock) => {
                sandboxd_args.push(format!("{TERMINATOR_SOCKET_FLAG}={}", sock.display()));
                cfg.upstream_socket = Some(sock);
            }
            Err(e) => {
                return fail(
                    1,
                    format!(
                        "cannot make a private directory for sandboxd's socket in {}: {e}",
                        std::env::temp_dir().display()
                    ),
                )
            }
        }
    }
    let socket_dir = cfg
        .upstream_socket
        .as_ref()
        .and_then(|s| s.parent())
        .map(PathBuf::from);
    let code = serve(cfg, bin, sandboxd_args, &mut term, &mut int).await;
    if let Some(d) = socket_dir {
        let _ = std::fs::remove_dir_all(d);
    }
    code
}

async fn serve(
    cfg: TerminatorConfig,
    bin: PathBuf,
    sandboxd_args: Vec<String>,
    term: &mut tokio::signal::unix::Signal,
    int: &mut tokio::signal::unix::Signal,
) -> ExitCode {
    let sandboxd = match Sandboxd::spawn(&bin, &sandboxd_args) {
        Ok(s) => s,
        Err(e) => {
            return fail(
                2,
                format!("{}: cannot start {}: {e}", env::SANDBOXD_BIN, bin.display()),
            )
        }
    };
    tracing::info!(
        "started sandboxd (pid {}): {}",
        sandboxd.pid(),
        bin.display()
    );
    let ready = tokio::select! {
        r = sandboxd.wait_ready(cfg.upstream, cfg.startup_timeout) => r,
        _ = term.recv() => return stop_during_startup(&sandboxd, "SIGTERM").await,
        _ = int.recv() => return stop_during_startup(&sandboxd, "SIGINT").await,
    };
    match ready {
        Ok(()) => {}
        Err(NotReady::Exited(e)) => {
            tracing::error!(
                "sandboxd exited before accepting connections ({e}); exiting with its status"
            );
            return ExitCode::from(e.code() as u8);
        }
        Err(e) => {
            tracing::error!("{e}; stopping it");
            sandboxd.stop(SANDBOXD_STOP_GRACE).await;
            return ExitCode::from(1);
        }
    }
    let upstream = match &cfg.upstream_socket {
        Some(sock) => format!(
            "unix:{} (client certificates verified; no token needed)",
            sock.display()
        ),
        None => cfg.upstream.to_string(),
    };
    let drain = cfg.drain_timeout;
    let terminator = match Terminator::bind(cfg).await {
        Ok(t) => t,
        Err(e) => {
            tracing::error!("{e}; stopping sandboxd");
            sandboxd.stop(SANDBOXD_STOP_GRACE).await;
            return ExitCode::from(1);
        }
    };
    tracing::info!(
        "listening on {}; forwarding TLS 1.3 (h2) connections to sandboxd at {upstream}",
        terminator.local_addr()
    );

    enum Why {
        Signal(&'static str),
        SandboxdExited,
    }
    let (why_tx, mut why_rx) = tokio::sync::oneshot::channel();
    let shutdown = {
        let sandboxd = &sandboxd;
        async move {
            let why = tokio::select! {
                _ = term.recv() => Why::Signal("SIGTERM"),
                _ = int.recv() => Why::Signal("SIGINT"),
                _ = sandboxd.exited() => Why::SandboxdExited,
            };
            if let Why::Signal(name) = &why {
                tracing::info!(
                    "{name}: stopping; sandboxd is asked to finish its calls, open connections get up to {drain:?}"
                );
                // sandboxd answers SIGTERM by refusing new calls and closing its connections
                // once the calls in flight finish, which is what lets the drain end early.
                sandboxd.terminate();
            }
            let _ = why_tx.send(why);
        }
    };
    let report = terminator.run(shutdown).await;
    let why = why_rx.try_recv().ok();
    match why {
        Some(Why::SandboxdExited) | None => {
            let e = sandboxd.exited().await;
            tracing::error!("sandboxd exited ({e}); the terminator exits with its status");
            ExitCode::from(e.code() as u8)
        }
        Some(Why::Signal(_)) => {
            let e = sandboxd.stop(SANDBOXD_STOP_GRACE).await;
            tracing::info!(
                "stopped: sandboxd ended ({e}); {} connection(s) were open, {} cut at the drain bound",
                report.open_at_shutdown,
                report.cut
            );
            if report.cut == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
    }
}
