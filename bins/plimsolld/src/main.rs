//! plimsolld: the daemon. Reads its configuration from the environment (every variable is
//! listed in `--help`), starts one provider, and serves protocol 5 until SIGTERM, when it
//! drains runs in flight. It never holds a signing key and never logs a token.

use std::process::ExitCode;

use clap::Parser;
use plimsoll_daemon::env::ProcessEnv;
use plimsoll_daemon::{config, Config, StartError};
use tokio::signal::unix::Signal;

const EXIT_HELP: &str = "\
Exit codes:
  0  stopped after SIGTERM or SIGINT (also during startup), runs in flight answered
     (SIGHUP does not stop it: it re-reads PLIMSOLL_CLIENTS_FILE)
  1  the provider failed its startup checks or smoke test, or a listener could not be bound
  2  a configuration error: one line names the variable or file to fix";

#[derive(Parser)]
#[command(
    name = "plimsolld",
    version,
    about = "plimsoll daemon: runs untrusted code behind a wall whose strength it states",
    long_about = None,
    after_help = format!("Environment (all configuration comes from here):\n{}\n{EXIT_HELP}", config::variables_help())
)]
struct Args {
    /// Log format on stderr (default: text on a terminal, JSON otherwise).
    #[arg(long, value_enum)]
    log_format: Option<plimsoll_log::LogFormat>,
}

fn main() -> ExitCode {
    // Before any thread: no descriptor this process inherited reaches a run (docs/plimsolld.md).
    plimsoll_log::fds::at_start("plimsolld");
    // Re-executed as the quickjs provider's worker: run one snippet and nothing else.
    if let Some(code) = plimsoll_quickjs::run_if_worker() {
        return code;
    }
    let args = Args::parse();
    plimsoll_log::init(args.log_format);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("plimsolld: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    rt.block_on(run())
}

async fn run() -> ExitCode {
    for name in config::unknown_variables(&ProcessEnv) {
        tracing::warn!(variable = %name, "unknown variable ignored; `plimsolld --help` lists the ones read");
    }
    let cfg = match Config::from_env(&ProcessEnv) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("plimsolld: {e}");
            return ExitCode::from(2);
        }
    };
    // From here a signal stops the daemon in order (for docker: no container is left)
    // instead of ending the process at once, also during the startup smoke test.
    let mut signals = Signals::install();
    let daemon = match plimsoll_daemon::start_until(cfg, signals.recv()).await {
        Ok(d) => d,
        Err(StartError::Stopped) => {
            tracing::info!("stopped during startup");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("plimsolld: {e}");
            return ExitCode::from(e.exit_code());
        }
    };
    // SIGHUP re-reads the callers file (docs/plimsolld.md, "Reloading callers"); SIGTERM
    // and SIGINT stop the daemon.
    while let Some(Reload) = signals.recv_or_reload().await {
        match daemon.reload_callers() {
            Ok(callers) => tracing::info!(callers, "callers file reloaded"),
            Err(e) => {
                tracing::warn!(error = %e, "callers file not reloaded; the table in use stays")
            }
        }
    }
    tracing::info!("shutting down: refusing new runs, answering runs in flight");
    daemon.shutdown().await;
    ExitCode::SUCCESS
}

/// A SIGHUP: reload the callers file.
struct Reload;

/// SIGTERM and SIGINT (stop) and SIGHUP (reload), caught from when they are installed (a
/// signal that arrives before `recv` is kept for it). A SIGHUP during startup is taken as a
/// reload once the daemon serves, never as the default action that would end it.
struct Signals(Option<(Signal, Signal, Signal)>);

impl Signals {
    fn install() -> Signals {
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
            signal(SignalKind::hangup()),
        ) {
            (Ok(term), Ok(int), Ok(hup)) => Signals(Some((term, int, hup))),
            _ => Signals(None),
        }
    }

    /// Waits for SIGTERM or SIGINT; a SIGHUP meanwhile is ignored (startup).
    async fn recv(&mut self) {
        while self.recv_or_reload().await.is_some() {}
    }

    /// Waits for SIGTERM or SIGINT (`None`) or SIGHUP (`Some(Reload)`).
    async fn recv_or_reload(&mut self) -> Option<Reload> {
        match &mut self.0 {
            Some((term, int, hup)) => {
                tokio::select! {
                    _ = term.recv() => None,
                    _ = int.recv() => None,
                    _ = hup.recv() => Some(Reload),
                }
            }
            None => {
                let _ = tokio::signal::ctrl_c().await;
                None
            }
        }
    }
}
