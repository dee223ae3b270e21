//! plimsoll-mcp: the MCP server agents use. Tools `run_code`, `open_session`,
//! `close_session` and `describe`, over stdio (the default, for desktop agents) or
//! streamable HTTP (`--listen`), through plimsolld (`--daemon`) or, without one, an embedded
//! daemon started the way `plimsoll run` starts its own.
//!
//! Logs go to stderr only (stdout is the protocol channel on stdio). No token, session id,
//! code or output is ever logged. Exit codes are listed in [`EXIT_CODES`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use plimsoll_client::{Client, ClientOptions};
use plimsoll_mcp::http::{HttpOptions, Limits, Listener};
use plimsoll_mcp::{CallFiles, PlimsollMcp};

const EXIT_CODES: &str = "\
Exit codes:
  0  the client closed stdin (stdio), or a signal (SIGINT, SIGTERM) stopped the server;
     the sessions it held were closed
  1  serving failed (the protocol channel broke)
  2  usage or configuration error (one line naming the bad flag, variable or file), or
     the embedded daemon's --provider cannot run on this machine (naming why)
  4  the daemon could not be reached, or the embedded daemon did not start

Variables:
  PLIMSOLL_CALLER_TOKEN  the caller token for --daemon (instead of --token-file)
  PLIMSOLL_MCP_TOKEN     the bearer token HTTP clients must send (instead of
                         --http-token-file); required with --listen HOST:PORT
  SANDBOX_BWRAP_PATH, SANDBOX_BWRAP_SANDBOXD, SANDBOX_BWRAP_USER, SANDBOX_BWRAP_POOL,
  SANDBOX_PROCESS_USER   the embedded daemon's bwrap and process settings (as for
                         plimsolld; no other SANDBOX_* variable is read)
  RUST_LOG               the log level (default warn)";

/// The MCP server agents use: run code in plimsoll's sandbox, with sessions and call files.
#[derive(Debug, Parser)]
#[command(name = "plimsoll-mcp", version, after_help = EXIT_CODES)]
struct Cli {
    /// The plimsolld to send calls to (http://HOST:PORT, or https:// with --ca-file).
    /// Without it an embedded daemon is started in this process (see --provider).
    #[arg(long, value_name = "URL")]
    daemon: Option<String>,
    /// File holding the caller token for --daemon (or set PLIMSOLL_CALLER_TOKEN).
    #[arg(long, value_name = "FILE", requires = "daemon")]
    token_file: Option<PathBuf>,
    /// PEM CA certificates an https:// daemon's certificate must chain to.
    #[arg(long, value_name = "FILE", requires = "daemon")]
    ca_file: Option<PathBuf>,
    /// Without --daemon: the embedded daemon's provider. `bwrap` runs python3, node and sh
    /// in a bubblewrap sandbox per run or session (tier container; needs bwrap 0.8 or
    /// later, user namespaces and plimsoll-sandboxd beside this binary or in
    /// SANDBOX_BWRAP_SANDBOXD); `process` runs them with no wall; both keep sessions.
    /// `quickjs` runs JavaScript snippets only and needs nothing installed. Without it:
    /// bwrap when its smoke test passes here, else process; the first line on stderr says
    /// which and why.
    #[arg(long, value_name = "NAME", value_parser = ["bwrap", "process", "quickjs"], conflicts_with = "daemon")]
    provider: Option<String>,
    /// Write every regular text file under DIR into every run_code call, fresh or in a
    /// session, before the call's own files (a call's file at the same path is refused).
    #[arg(long, value_name = "DIR")]
    call_files: Option<PathBuf>,
    /// Serve streamable HTTP at http://ADDR/mcp instead of stdio: HOST:PORT (for example
    /// 127.0.0.1:8750; a bearer token is always required, --http-token-file or
    /// PLIMSOLL_MCP_TOKEN), or unix:PATH, a Unix socket made with mode 0600 that only this
    /// user can open (no token needed).
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// File holding the bearer token HTTP clients must send (or set PLIMSOLL_MCP_TOKEN).
    #[arg(long, value_name = "FILE", requires = "listen")]
    http_token_file: Option<PathBuf>,
    /// A Host name HTTP clients may use besides localhost and loopback addresses
    /// (repeatable; a guard against DNS rebinding).
    #[arg(long, value_name = "HOST", requires = "listen")]
    allowed_host: Vec<String>,
    /// A browser origin (scheme://host:port, or :* for any port) whose requests are
    /// served (repeatable). A request carrying any other Origin header is refused 403;
    /// requests without one (non-browser clients) are served.
    #[arg(long, value_name = "ORIGIN", requires = "listen")]
    allowed_origin: Vec<String>,
    /// HTTP connections served at once; more wait until one ends.
    #[arg(long, value_name = "N", default_value_t = Limits::DEFAULT_MAX_CONNECTIONS as u32,
          value_parser = clap::value_parser!(u32).range(1..=65_536))]
    max_connections: u32,
    /// Milliseconds an HTTP connection may take to send a request's headers (also
    /// between requests on a kept-alive connection).
    #[arg(long, value_name = "MS", default_value_t = Limits::DEFAULT_HEADER_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    header_timeout_ms: u64,
    /// Milliseconds an HTTP connection may move no byte either way before it is closed
    /// (SSE streams send a keep-alive every 15 s).
    #[arg(long, value_name = "MS", default_value_t = Limits::DEFAULT_IDLE_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    idle_timeout_ms: u64,
    /// Log format on stderr: text (default on a terminal) or json (default otherwise).
    #[arg(long, value_enum)]
    log_format: Option<plimsoll_log::LogFormat>,
}

/// A failure and the exit code it maps to.
struct Fail(u8, anyhow::Error);

fn usage(e: impl Into<anyhow::Error>) -> Fail {
    Fail(2, e.into())
}

/// The sessions the embedded daemon keeps for this server.
const EMBEDDED_SESSIONS: usize = 16;

fn main() -> ExitCode {
    // Before any thread: no descriptor this process inherited reaches a run (docs/plimsolld.md).
    plimsoll_log::fds::at_start("plimsoll-mcp");
    // Re-executed as the quickjs provider's worker: run one snippet and nothing else.
    if let Some(code) = plimsoll_quickjs::run_if_worker() {
        return code;
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            let text = e.render().to_string();
            let first = text.split("\n\n").next().unwrap_or(&text);
            say(&format!(
                "plimsoll-mcp: {}",
                first.split_whitespace().collect::<Vec<_>>().join(" ")
            ));
            return ExitCode::from(2);
        }
    };
    plimsoll_log::init_at(cli.log_format, "warn");
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            say(&format!(
                "plimsoll-mcp: cannot start the async runtime: {e}"
            ));
            return ExitCode::from(4);
        }
    };
    let outcome = rt.block_on(serve(cli));
    // stdio's reader blocks in a thread that cannot be cancelled: do not wait for it.
    rt.shutdown_background();
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(Fail(code, e)) => {
            say(&format!("plimsoll-mcp: {e:#}"));
            ExitCode::from(code)
        }
    }
}

fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Reads a token from `file`, else from `var`; `None` when neither is given.
fn token(file: Option<&Path>, flag: &str, var: &str) -> Result<Option<String>, Fail> {
    let (text, from) = match file {
        Some(f) => (
            std::fs::read_to_string(f)
                .with_context(|| format!("{flag} {}: cannot read", f.display()))
                .map_err(usage)?,
            format!("{flag} {}", f.display()),
        ),
        None => match std::env::var(var) {
            Ok(v) => (v, var.to_owned()),
            Err(_) => return Ok(None),
        },
    };
    let t = text.trim();
    if t.is_empty() {
        // Set but blank is a mistake, never a way to turn authentication off.
        return Err(usage(anyhow::anyhow!(
            "{from} is empty: give the token, or leave {from} out"
        )));
    }
    if !t.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(usage(anyhow::anyhow!(
            "{from}: a token is one run of visible ASCII characters (the value is not shown)"
        )));
    }
    Ok(Some(t.to_owned()))
}

async fn serve(cli: Cli) -> Result<(), Fail> {
    let call_files = match &cli.call_files {
        Some(dir) => CallFiles::from_dir(dir).map_err(usage)?,
        None => CallFiles::new(),
    };
    let listen = cli.listen.as_deref().map(Listen::parse).transpose()?;
    let http_token = match &listen {
        Some(at) => {
            let t = token(
                cli.http_token_file.as_deref(),
                "--http-token-file",
                "PLIMSOLL_MCP_TOKEN",
            )?;
            if t.as_ref().is_some_and(|t| t.len() < MIN_HTTP_TOKEN) {
                return Err(usage(anyhow::anyhow!(
                    "the HTTP bearer token is shorter than {MIN_HTTP_TOKEN} characters (the value is not shown); use a random one, for example `openssl rand -hex 32`"
                )));
            }
            if let (None, Listen::Tcp(addr)) = (&t, at) {
                // Loopback included: any local user (or a sandboxed program) reaches it.
                return Err(usage(anyhow::anyhow!(
                    "--listen {addr} needs a bearer token: give --http-token-file FILE or set PLIMSOLL_MCP_TOKEN (or serve only this user with --listen unix:PATH)"
                )));
            }
            t
        }
        None => None,
    };
    // Bound before the embedded daemon starts, so a bad path is exit 2 with nothing started.
    let listener = match &listen {
        Some(Listen::Tcp(addr)) => Some(Listener::Tcp(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("--listen {addr}: cannot listen"))
                .map_err(usage)?,
        )),
        Some(Listen::Unix(path)) => Some(Listener::Unix(
            plimsoll_mcp::http::bind_unix(path)
                .map_err(|e| usage(anyhow::anyhow!("--listen unix:{e}")))?,
        )),
        None => None,
    };
    let (client, embedded) = match &cli.daemon {
        Some(url) => {
            check_daemon_address(url, cli.ca_file.as_deref())?;
            let token = token(
                cli.token_file.as_deref(),
                "--token-file",
                "PLIMSOLL_CALLER_TOKEN",
            )?;
            let opts = ClientOptions {
                token,
                ca_file: cli.ca_file.clone(),
            };
            let c = Client::connect(url, opts)
                .await
                .map_err(|e| Fail(4, anyhow::anyhow!("--daemon {url}: {e}")))?;
            (c, None)
        }
        None => {
            use plimsoll_daemon::embedded::{EmbeddedError, Want};
            let want = match cli.provider.as_deref() {
                Some(p) => Want::Named(p),
                None => Want::Strongest,
            };
            let sessions = if want == Want::Named("quickjs") {
                0
            } else {
                EMBEDDED_SESSIONS
            };
            let e = match plimsoll_daemon::embedded::start(
                want,
                sessions,
                &plimsoll_daemon::env::ProcessEnv,
            )
            .await
            {
                Ok(e) => e,
                // The machine cannot give what was asked for: a configuration error.
                Err(e @ (EmbeddedError::Unavailable { .. } | EmbeddedError::StateDir(_))) => {
                    let flag = match want {
                        Want::Named(p) => format!("--provider {p}: "),
                        Want::Strongest => String::new(),
                    };
                    return Err(usage(anyhow::anyhow!("{flag}{e}")));
                }
                Err(e) => {
                    return Err(Fail(
                        4,
                        anyhow::anyhow!("the embedded daemon did not start: {e}"),
                    ))
                }
            };
            // The first line on stderr: which provider runs, and why.
            say(&format!("plimsoll-mcp: {}", e.chosen));
            for note in &e.chosen.notes {
                say(&format!("plimsoll-mcp: {note}"));
            }
            let opts = ClientOptions {
                token: Some(e.token.clone()),
                ca_file: None,
            };
            match Client::connect(&e.url, opts).await {
                Ok(c) => (c, Some(e.daemon)),
                Err(err) => {
                    e.daemon.shutdown().await;
                    return Err(Fail(4, anyhow::anyhow!("the embedded daemon: {err}")));
                }
            }
        }
    };
    let server = PlimsollMcp::new(client, call_files);
    let served = match listener {
        Some(listener) => {
            let at = match &listener {
                Listener::Tcp(l) => {
                    let bound = l.local_addr().map_err(|e| usage(anyhow::Error::from(e)))?;
                    format!("http://{bound}/mcp")
                }
                Listener::Unix(_) => match &listen {
                    Some(Listen::Unix(p)) => format!("unix:{} (path /mcp)", p.display()),
                    _ => String::new(),
                },
            };
            tracing::info!(at = %at, "serving MCP over streamable HTTP");
            // The one line a script waits for (stderr, whatever the log level).
            say(&format!(
                "plimsoll-mcp: serving MCP at {at} ({})",
                if http_token.is_some() {
                    "bearer token required"
                } else {
                    "no token: the socket's mode 0600 is the gate"
                }
            ));
            let opts = HttpOptions {
                bearer_token: http_token,
                allowed_hosts: cli.allowed_host.clone(),
                allowed_origins: cli.allowed_origin.clone(),
                limits: Limits {
                    max_connections: cli.max_connections as usize,
                    header_timeout: Duration::from_millis(cli.header_timeout_ms),
                    idle_timeout: Duration::from_millis(cli.idle_timeout_ms),
                },
            };
            let r = plimsoll_mcp::http::serve(listener, server.clone(), opts, stop_signal()).await;
            server.close_all().await;
            if let Some(Listen::Unix(p)) = &listen {
                let _ = std::fs::remove_file(p);
            }
            r
        }
        None => tokio::select! {
            r = plimsoll_mcp::serve_stdio(server.clone()) => r,
            () = stop_signal() => {
                server.close_all().await;
                Ok(())
            }
        },
    };
    if let Some(d) = embedded {
        d.shutdown().await;
    }
    served.map_err(|e| Fail(1, anyhow::anyhow!("serving MCP failed: {e}")))
}

/// Where `--listen` serves.
enum Listen {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl Listen {
    fn parse(s: &str) -> Result<Listen, Fail> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(usage(anyhow::anyhow!(
                    "--listen unix: needs a path, for example unix:/run/user/1000/plimsoll-mcp.sock"
                )));
            }
            return Ok(Listen::Unix(PathBuf::from(path)));
        }
        s.parse().map(Listen::Tcp).map_err(|_| {
            usage(anyhow::anyhow!(
                "--listen {s}: give HOST:PORT (for example 127.0.0.1:8750) or unix:PATH"
            ))
        })
    }
}

/// The shortest HTTP bearer token accepted.
const MIN_HTTP_TOKEN: usize = 16;

/// Mistakes in `--daemon` and `--ca-file` that are configuration errors (exit 2), found
/// before dialling, so exit 4 keeps meaning "could not be reached".
fn check_daemon_address(url: &str, ca_file: Option<&Path>) -> Result<(), Fail> {
    let bad = |why: &str| usage(anyhow::anyhow!("--daemon {url}: {why}"));
    match url.split_once("://").map(|(scheme, _)| scheme) {
        Some("http") if ca_file.is_some() => Err(bad(
            "--ca-file is for an https:// daemon; use https://, or leave --ca-file out",
        )),
        Some("http") => Ok(()),
        Some("https") => match ca_file {
            None => Err(bad(
                "an https:// daemon needs --ca-file (the system's roots are never trusted)",
            )),
            Some(f) => std::fs::metadata(f)
                .map(|_| ())
                .map_err(|e| usage(anyhow::anyhow!("--ca-file {}: {e}", f.display()))),
        },
        _ => Err(bad(
            "not a daemon address: give http://HOST:PORT or https://HOST:PORT",
        )),
    }
}

/// Completes on SIGINT or SIGTERM.
async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
