//! Startup and shutdown: build the provider, run its smoke test, enforce the startup floor
//! and hardened mode, bind the listeners, serve, and drain on shutdown.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::http::StatusCode;
use plimsoll_core::pb::sandbox_service_server::SandboxServiceServer;
use plimsoll_core::Tier;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::auth::Authenticator;
use crate::config::{is_loopback, CallerAuth, Config, RESOURCE_VARIABLES};
use crate::doors::{self, HealthDoor};
use crate::metrics::Metrics;
use crate::provider::{self, Provider};
use crate::service::Service;
use crate::sessions::SessionTable;

/// Why the daemon did not start. Each message names what to fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The provider could not be built or failed its smoke test.
    #[error(transparent)]
    Provider(provider::ProviderStartError),
    /// The provider's proven tier is below `SANDBOX_MIN_ISOLATION`.
    #[error("SANDBOX_MIN_ISOLATION: the floor is {floor} and the {provider} provider proved {tier}; refusing to serve below the floor")]
    BelowFloor {
        /// The configured floor.
        floor: String,
        /// The provider.
        provider: String,
        /// The proven tier.
        tier: String,
    },
    /// Hardened mode found missing safeguards (all of them are listed).
    #[error("PLIMSOLL_HARDENED: refusing to start; missing safeguards:\n  - {}", .0.join("\n  - "))]
    Hardened(Vec<String>),
    /// A listener could not be bound.
    #[error("{var}: cannot listen on {addr}: {source}")]
    Bind {
        /// The variable naming the address.
        var: &'static str,
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The TLS files could not be read.
    #[error("{var}: {message}")]
    Tls {
        /// The variable naming the file.
        var: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The provider's startup ship scan refused the image (a refuse-mode find, or an
    /// unreadable file not on its known list) or could not read it. Names the image ID and
    /// each place, never the matched bytes.
    #[error("PLIMSOLL_WITHHELD_SET: {0}")]
    Withheld(String),
    /// The stop signal came before the daemon served; the provider was stopped (for
    /// docker: every container of the instance removed) and nothing was served.
    #[error("stopped during startup; nothing was served")]
    Stopped,
    /// Sessions are on for a provider that does not keep them.
    #[error("SANDBOX_MAX_SESSIONS: {0}")]
    Sessions(String),
    /// The startup session smoke test failed.
    #[error("session smoke test failed: {0}")]
    SessionSmoke(String),
}

impl StartError {
    /// plimsolld's exit code for this refusal (listed in `plimsolld --help`): 2 for what the
    /// operator configured (a floor above the tier, hardened mode's missing safeguards, TLS
    /// files), 1 for what failed at run time (the provider's checks, a listener, the ship
    /// scan), 0 for a stop signal during startup. The match has no catch-all, so a new
    /// variant must choose its code.
    pub fn exit_code(&self) -> u8 {
        match self {
            StartError::BelowFloor { .. }
            | StartError::Hardened(_)
            | StartError::Tls { .. }
            | StartError::Sessions(_) => 2,
            StartError::Provider(_)
            | StartError::Bind { .. }
            | StartError::Withheld(_)
            | StartError::SessionSmoke(_) => 1,
            StartError::Stopped => 0,
        }
    }
}

impl From<provider::ProviderStartError> for StartError {
    fn from(e: provider::ProviderStartError) -> StartError {
        match e.kind {
            provider::StartFailure::ShipScan => StartError::Withheld(e.message),
            provider::StartFailure::Check => StartError::Provider(e),
        }
    }
}

/// Hardened mode: every safeguard that is missing, each with what to set.
pub fn hardened_violations(cfg: &Config, tier: Option<Tier>) -> Vec<String> {
    let mut v = Vec::new();
    match tier {
        Some(Tier::Kernel | Tier::Vm) => {}
        other => v.push(format!(
            "isolation is {}; hardened mode needs kernel or vm (SANDBOX_PROVIDER=docker with SANDBOX_DOCKER_RUNTIME=runsc, or agentsandbox with gVisor or Kata)",
            other.map_or("none", |t| t.as_str())
        )),
    }
    if cfg.clients_file.is_none() || !matches!(cfg.auth, CallerAuth::Registry(_)) {
        v.push("PLIMSOLL_CLIENTS_FILE is not set; callers must authenticate with tokens from a callers file".into());
    }
    if cfg.tls.is_none() && !is_loopback(&cfg.addr) {
        v.push(format!(
            "PLIMSOLL_TLS_CERT/PLIMSOLL_TLS_KEY are not set and PLIMSOLL_ADDR {} is not loopback: callers' bearer tokens would cross the network in plaintext (set both, or listen on a loopback address)",
            cfg.addr
        ));
    }
    if cfg.sessions.enabled() && cfg.sessions.per_caller == 0 {
        v.push("SANDBOX_MAX_SESSIONS_PER_CALLER is 0 (no per-caller cap); with sessions on, one caller could hold every session (set a positive cap, or leave it unset for a quarter of SANDBOX_MAX_SESSIONS)".into());
    }
    if let Some(m) = cfg.metrics_addr.filter(|m| !is_loopback(m)) {
        v.push(format!("PLIMSOLL_METRICS_ADDR {m} is not loopback; the metrics listener serves plain HTTP (set it to a loopback address or off)"));
    }
    for name in RESOURCE_VARIABLES {
        if !cfg.shared.explicit_resources.contains(&name) {
            v.push(format!(
                "{name} is not set; hardened mode needs an explicit positive resource envelope"
            ));
        }
    }
    let r = &cfg.shared.resources;
    if cfg.shared.explicit_resources.len() == 4
        && (r.memory_mb == 0 || r.cpus <= 0.0 || r.pids == 0 || r.disk_mb == 0)
    {
        v.push("SANDBOX_MEMORY_MB, SANDBOX_CPUS, SANDBOX_PIDS and SANDBOX_DISK_MB must all be greater than 0".into());
    }
    v.extend(cfg.provider.hardened_gaps());
    v
}

/// The startup warning for bearer tokens accepted over plaintext gRPC on an address other
/// hosts can reach (`None` when the listener has TLS, is loopback, or takes no tokens).
/// Hardened mode refuses the same configuration (see [`hardened_violations`]).
pub fn plaintext_tokens_warning(cfg: &Config) -> Option<String> {
    if cfg.tls.is_some() || is_loopback(&cfg.addr) || !matches!(cfg.auth, CallerAuth::Registry(_)) {
        return None;
    }
    Some(format!(
        "PLIMSOLL_ADDR {} is not a loopback address and PLIMSOLL_TLS_CERT/PLIMSOLL_TLS_KEY are not set: \
         callers' bearer tokens, their code and their results cross the network in plaintext, readable and \
         replayable by anyone on the path. Set PLIMSOLL_TLS_CERT and PLIMSOLL_TLS_KEY, or set PLIMSOLL_ADDR to a \
         loopback address (behind a TLS proxy); PLIMSOLL_HARDENED=1 refuses to start like this",
        cfg.addr
    ))
}

/// A daemon that is serving.
pub struct RunningDaemon {
    rpc_addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    draining: Arc<AtomicBool>,
    /// `grpc.health.v1.Health`'s states: `SERVING` until the drain starts.
    health: HealthDoor,
    stop: Arc<Notify>,
    rpc: JoinHandle<Result<(), tonic::transport::Error>>,
    metrics_task: Option<JoinHandle<()>>,
    grace: std::time::Duration,
    /// Stopped last (`Provider::stop`: for docker, every container of the instance removed).
    provider: Arc<dyn Provider>,
    /// The open sessions (ended `SHUTDOWN` after the drain) and their sweeper.
    sessions: Option<(Arc<SessionTable>, JoinHandle<()>)>,
    /// The callers table every listener checks, and the file it was read from.
    auth: Authenticator,
    clients_file: Option<std::path::PathBuf>,
    /// Grant profiles on a provider whose runs share one user, without the operator's
    /// trust-all statement: the callers file may name one caller only (the startup check of
    /// docs/grants.md), so a reload that would add a second is refused.
    one_caller_only: bool,
}

impl RunningDaemon {
    /// The RPC listener's bound address.
    pub fn rpc_addr(&self) -> SocketAddr {
        self.rpc_addr
    }
    /// What the provider states about itself (its name, the tier it proved, its
    /// environment identity).
    pub fn facts(&self) -> plimsoll_provider::Facts {
        self.provider.facts()
    }
    /// The metrics listener's bound address, if on.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }
    /// Reads `PLIMSOLL_CLIENTS_FILE` again and, when it parses and checks, puts it in place
    /// of the table every listener uses, whole: a new caller is served and a removed one is
    /// refused from their next request. A file that does not parse, or that would break the
    /// one-caller rule for grants on a shared-user provider, changes nothing (the error
    /// says why). Returns how many callers the new table holds. Sessions a removed
    /// caller opened are not ended by the reload: their calls are refused (every call is
    /// authenticated) and they end at their lifetime.
    pub fn reload_callers(&self) -> Result<usize, String> {
        let Some(path) = &self.clients_file else {
            return Err("no PLIMSOLL_CLIENTS_FILE: there is no callers file to reload".into());
        };
        let file = plimsoll_callers::CallersFile::load(path).map_err(|e| e.to_string())?;
        let registry = plimsoll_callers::Registry::new(file).map_err(|e| e.to_string())?;
        let n = registry.len();
        if self.one_caller_only && n > 1 {
            return Err(format!(
                "{} names {n} callers, and grant profiles on a provider whose runs share one user allow one \
                 (any caller's run could use another run's grant; docs/grants.md). Keep one caller, or restart \
                 with PLIMSOLL_PROCESS_GRANTS_TRUST_ALL_CALLERS=1 or another provider",
                path.display()
            ));
        }
        self.auth.replace(CallerAuth::Registry(registry));
        Ok(n)
    }
    /// Stops accepting, refuses new runs as `capacity`, waits (bounded by the grace period)
    /// for runs in flight to be answered, then stops the provider (the docker provider
    /// removes every container of its instance, bounded) and returns.
    pub async fn shutdown(self) {
        self.draining.store(true, Ordering::SeqCst);
        // Health says NOT_SERVING and ends its Watch streams before the listener drains: an
        // open Watch would otherwise hold the drain for the whole grace period.
        self.health.draining().await;
        // notify_one stores a permit: the server's shutdown future may not have been
        // polled yet (a daemon stopped right after it started), and notify_waiters would
        // lose the signal and hold shutdown for the whole grace period.
        self.stop.notify_one();
        match tokio::time::timeout(self.grace, self.rpc).await {
            Ok(Ok(Ok(()))) => tracing::info!("drained; every run in flight was answered"),
            Ok(Ok(Err(e))) => tracing::error!(error = %e, "RPC server ended with an error"),
            Ok(Err(e)) => tracing::error!(error = %e, "RPC server task failed"),
            Err(_) => tracing::error!(
                grace_s = self.grace.as_secs(),
                "runs still in flight after the grace period; exiting"
            ),
        }
        if let Some(m) = self.metrics_task {
            m.abort();
        }
        if let Some((table, sweeper)) = self.sessions {
            sweeper.abort();
            table.shutdown().await;
        }
        self.provider.stop().await;
    }
    /// Waits until the RPC server ends on its own (it only ends through `shutdown`).
    pub async fn stopped(&mut self) {
        let _ = (&mut self.rpc).await;
    }
}

fn read_tls(cfg: &Config) -> Result<Option<tonic::transport::ServerTlsConfig>, StartError> {
    let Some((cert, key)) = &cfg.tls else {
        return Ok(None);
    };
    let c = std::fs::read(cert).map_err(|e| StartError::Tls {
        var: "PLIMSOLL_TLS_CERT",
        message: format!("{}: {e}", cert.display()),
    })?;
    let k = std::fs::read(key).map_err(|e| StartError::Tls {
        var: "PLIMSOLL_TLS_KEY",
        message: format!("{}: {e}", key.display()),
    })?;
    Ok(Some(
        tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(c, k)),
    ))
}

/// Starts a daemon: provider smoke test, floor, hardened mode, listeners. Returns once
/// the daemon is serving.
pub async fn start(cfg: Config) -> Result<RunningDaemon, StartError> {
    start_until(cfg, std::future::pending()).await
}

/// [`start`], unless `stop` completes first (plimsolld passes its SIGTERM/SIGINT): then
/// startup keeps going only until the provider is stopped, so a container it is launching
/// is removed rather than abandoned, and the answer is [`StartError::Stopped`]. A startup
/// that fails stops the provider too before it answers.
pub async fn start_until(
    cfg: Config,
    stop: impl std::future::Future<Output = ()>,
) -> Result<RunningDaemon, StartError> {
    let provider = cfg.provider.build()?;
    let starting = start_with(cfg, provider.clone());
    tokio::pin!(starting);
    tokio::pin!(stop);
    tokio::select! {
        r = &mut starting => {
            if r.is_err() {
                provider.stop().await;
            }
            r
        }
        () = &mut stop => {
            tracing::info!("stop signal during startup: stopping the provider, serving nothing");
            // Startup is still polled while the provider stops: a launch in flight sees the
            // provider closed and removes its own container.
            let (started, ()) = tokio::join!(starting, provider.stop());
            if let Ok(daemon) = started {
                daemon.shutdown().await;
            }
            Err(StartError::Stopped)
        }
    }
}

/// [`start`] with a provider built elsewhere (an embedder's own, or a test's): `cfg.provider`
/// is then ignored. A failed startup does not stop `provider`; that is the caller's.
pub async fn start_with(
    cfg: Config,
    provider: Arc<dyn Provider>,
) -> Result<RunningDaemon, StartError> {
    provider.start().await?;
    let facts = provider.facts();
    if let Some(floor) = cfg.min_isolation.0 {
        if facts.tier.is_none_or(|t| t < floor) {
            return Err(StartError::BelowFloor {
                floor: floor.to_string(),
                provider: facts.name.clone(),
                tier: facts.tier.map_or("none".into(), |t| t.to_string()),
            });
        }
    }
    if cfg.hardened {
        let v = hardened_violations(&cfg, facts.tier);
        if !v.is_empty() {
            return Err(StartError::Hardened(v));
        }
    }
    let sessions = if cfg.sessions.enabled() {
        let Some(opener) = provider.sessions() else {
            return Err(StartError::Sessions(format!(
                "is {} but the {} provider does not keep sessions; set SANDBOX_MAX_SESSIONS=0, or use SANDBOX_PROVIDER=process",
                cfg.sessions.max_sessions, facts.name
            )));
        };
        crate::sessions::smoke::run(opener, &facts)
            .await
            .map_err(StartError::SessionSmoke)?;
        tracing::info!(
            max_sessions = cfg.sessions.max_sessions,
            "session smoke test passed"
        );
        Some(Arc::new(SessionTable::new(cfg.sessions.clone())))
    } else {
        None
    };
    if let Some(w) = plaintext_tokens_warning(&cfg) {
        tracing::warn!(addr = %cfg.addr, "{w}");
    }
    if !cfg.grants.is_empty() {
        for p in cfg.grants.open_to_every_caller() {
            tracing::warn!(
                profile = p,
                "grant profile is open to every caller (allowed_callers [\"*\"])"
            );
        }
        if !facts.supports_grants {
            tracing::warn!(provider = %facts.name, "PLIMSOLL_GRANTS_FILE is set but this provider offers no grants; granted requests are refused as unsupported");
        }
        if cfg.provider.runs_share_one_user() && cfg.process_grants_trust_all_callers {
            tracing::warn!(provider = cfg.provider.name(), "PLIMSOLL_PROCESS_GRANTS_TRUST_ALL_CALLERS=1: on this provider any caller's run can use the grant of any other run alive at the same time (runs share one user and no wall); every caller is trusted with every grant");
        }
        // The credentials now live in this process. Code running as the same user (the
        // process tier has no wall) could otherwise read them from /proc/<pid>/environ or
        // /proc/<pid>/mem; a non-dumpable process refuses both to anyone but root.
        if let Err(e) = nix::sys::prctl::set_dumpable(false) {
            tracing::warn!(error = %e, "could not mark plimsolld non-dumpable; same-user code may read its memory");
        }
        tracing::info!(profiles = ?cfg.grants.names(), "grant profiles loaded");
    }
    let tls = read_tls(&cfg)?;
    let metrics = Arc::new(Metrics::default());
    let draining = Arc::new(AtomicBool::new(false));
    let service = Service::new(
        provider.clone(),
        cfg.max_concurrent,
        cfg.shared.default_timeout,
        cfg.run_resources(),
        draining.clone(),
        metrics.clone(),
    )
    .with_grants(cfg.grants.clone());
    let service = match &sessions {
        Some(t) => service.with_sessions(t.clone()),
        None => service,
    };
    let sessions = sessions.map(|t| {
        let table = t.clone();
        let sweeper = tokio::spawn(async move {
            let mut tick = tokio::time::interval(crate::sessions::SWEEP_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                table.sweep().await;
            }
        });
        (t, sweeper)
    });
    let auth = Authenticator::new(cfg.auth.clone(), metrics.clone());
    let reload_auth = auth.clone();
    let svc = SandboxServiceServer::new(service)
        // The codec refuses anything over 8 MiB as a marked request refusal; tonic's own
        // cap sits above it so that refusal, not tonic's unmarked one, is what callers see.
        .max_decoding_message_size(2 * plimsoll_core::validate::MAX_REQUEST_BYTES)
        .max_encoding_message_size(64 * 1024 * 1024);
    let svc =
        tonic::service::interceptor::InterceptedService::new(svc, move |req| auth.intercept(req));

    let listener = TcpListener::bind(cfg.addr)
        .await
        .map_err(|source| StartError::Bind {
            var: "PLIMSOLL_ADDR",
            addr: cfg.addr,
            source,
        })?;
    let rpc_addr = listener.local_addr().map_err(|source| StartError::Bind {
        var: "PLIMSOLL_ADDR",
        addr: cfg.addr,
        source,
    })?;
    let metrics_listener = match cfg.metrics_addr {
        Some(a) => Some(
            TcpListener::bind(a)
                .await
                .map_err(|source| StartError::Bind {
                    var: "PLIMSOLL_METRICS_ADDR",
                    addr: a,
                    source,
                })?,
        ),
        None => None,
    };
    let metrics_addr = metrics_listener.as_ref().and_then(|l| l.local_addr().ok());

    // The RPC listener may take three quarters of the descriptors left after the reserve,
    // the metrics listener a few; runs, relays and the provider keep the rest.
    let rpc_limits = cfg.doors.fit_to_descriptors(75);
    let metrics_limits = plimsoll_listen::Limits {
        max_connections: crate::config::METRICS_MAX_CONNECTIONS,
        ..cfg.doors
    }
    .fit_to_descriptors(5);
    tracing::info!(
        max_connections = rpc_limits.max_connections,
        header_timeout_ms = rpc_limits.header_timeout.as_millis() as u64,
        idle_timeout_ms = rpc_limits.idle_timeout.as_millis() as u64,
        "RPC listener limits"
    );

    let stop = Arc::new(Notify::new());
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls).map_err(|e| StartError::Tls {
            var: "PLIMSOLL_TLS_CERT",
            message: e.to_string(),
        })?;
    }
    // Health and reflection sit beside the authenticated service, outside its interceptor:
    // probes and schema tools carry no token. Same listener, same TLS.
    let (health, health_svc) = HealthDoor::serving().await;
    // Every request is counted against its connection, so a connection with none in flight
    // for PLIMSOLL_IDLE_TIMEOUT_MS (pings do not count) is closed (plimsoll_listen).
    let router = builder
        .layer(plimsoll_listen::TrackLayer)
        .add_service(svc)
        .add_service(health_svc)
        .add_optional_service(cfg.reflection.then(doors::reflection_v1))
        .add_optional_service(cfg.reflection.then(doors::reflection_v1alpha));
    // A connection cap (more wait in the listen backlog, so connections alone never use up
    // the descriptors), the header and idle deadlines, and a pause after accept errors.
    // Every accepted connection gets TCP_NODELAY.
    let incoming = plimsoll_listen::Incoming::new(listener, rpc_limits, "PLIMSOLL_ADDR");
    let stop_rpc = stop.clone();
    let rpc = tokio::spawn(async move {
        router
            .serve_with_incoming_shutdown(incoming, async move { stop_rpc.notified().await })
            .await
    });

    let metrics_task = metrics_listener.map(|l| {
        let (m, p, d) = (metrics.clone(), provider.clone(), draining.clone());
        let tier = facts.tier.map_or("none", |t| t.as_str());
        let name = facts.name.clone();
        let app = axum::Router::new()
            .route("/healthz", axum::routing::get(|| async { "ok\n" }))
            .route(
                "/readyz",
                axum::routing::get(move || {
                    let (p, d) = (p.clone(), d.clone());
                    async move {
                        if !d.load(Ordering::SeqCst) && p.ready().await {
                            (StatusCode::OK, "ready\n")
                        } else {
                            (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                        }
                    }
                }),
            )
            .route(
                "/metrics",
                axum::routing::get(move || {
                    let m = m.clone();
                    let name = name.clone();
                    async move { m.render(&name, tier) }
                }),
            );
        tokio::spawn(serve_metrics(l, app, metrics_limits))
    });
    tracing::info!(addr = %rpc_addr, metrics = ?metrics_addr, provider = %facts.name,
        isolation = facts.tier.map_or("none", |t| t.as_str()), protocol = plimsoll_core::PROTOCOL,
        reflection = cfg.reflection, "serving");
    Ok(RunningDaemon {
        rpc_addr,
        metrics_addr,
        draining,
        health,
        stop,
        rpc,
        metrics_task,
        grace: cfg.shutdown_grace,
        provider,
        sessions,
        auth: reload_auth,
        one_caller_only: crate::config::one_caller_only(
            &cfg.provider,
            &cfg.grants,
            cfg.process_grants_trust_all_callers,
        ),
        clients_file: cfg
            .clients_file
            .clone()
            .filter(|_| matches!(cfg.auth, CallerAuth::Registry(_))),
    })
}

/// The metrics listener: HTTP/1.1 under `limits` (a connection cap, the header and idle
/// deadlines, a pause after accept errors). Its connections end with the task.
async fn serve_metrics(listener: TcpListener, app: axum::Router, limits: plimsoll_listen::Limits) {
    let mut incoming = plimsoll_listen::Incoming::new(listener, limits, "PLIMSOLL_METRICS_ADDR");
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let conn = tokio::select! {
            conn = incoming.accept() => conn,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
        };
        let svc = hyper_util::service::TowerToHyperService::new(
            plimsoll_listen::Track::for_connection(app.clone(), conn.tracker()),
        );
        conns.spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(hyper_util::rt::TokioIo::new(conn), svc)
                .await;
        });
    }
}
